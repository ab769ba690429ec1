//! The verifier rejects broken programs, naming the rank, the step and
//! what is wrong.

use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::verify::{VerifyOptions, verify, verify_with};
use oxccl_algo::{CollKind, Collective, Program, Slice, Step};

fn ring(n: usize, count: usize) -> Program {
    build(Algorithm::Ring, &Collective::new(CollKind::AllReduce, n, count), &BuildOptions::default()).unwrap()
}

fn err(p: &Program) -> String {
    verify(p).expect_err("a broken program verified").to_string()
}

fn assert_has(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(msg.contains(part), "{msg:?} does not mention {part:?}");
    }
}

#[test]
fn wrong_slice_is_named() {
    let mut p = ring(4, 400);
    // Rank 2's first step sends the wrong block (block 3 instead of 2).
    p.ranks[2].channels[0][0] = Step::Send { peer: 3, src: Slice::input(300, 100) };
    let msg = err(&p);
    assert_has(&msg, &["rank 3", "step 1", "input[", "different elements"]);
}

#[test]
fn missing_step_is_named() {
    let mut p = ring(4, 400);
    // Rank 1 forgets the all-gather's last receive.
    p.ranks[1].channels[0].pop();
    let msg = err(&p);
    assert_has(&msg, &["rank 0", "sends a message that rank 1 never receives"]);
    // Without the matching send, the receiver waits forever instead.
    let mut p = ring(4, 400);
    p.ranks[0].channels[0].pop();
    p.ranks[0].channels[0].remove(0);
    // Rank 1 now receives rank 0's all-gather data where it expects the
    // reduce-scatter's: the first symptom is named.
    assert_has(&err(&p), &["rank 1 step 1", "different elements"]);
}

#[test]
fn output_left_unwritten_is_named() {
    let mut p = ring(3, 30);
    // Rank 2's final recv writes scratch instead of its output.
    p.ranks[2].scratch = 10;
    let last = p.ranks[2].channels[0].last_mut().unwrap();
    *last = Step::Recv { peer: 1, dst: Slice::scratch(0, 10) };
    let msg = err(&p);
    assert_has(&msg, &["rank 2 output[", "never written"]);
}

#[test]
fn deadlock_is_named_with_every_blocked_rank() {
    // Both ranks receive before they send.
    let c = Collective::new(CollKind::SendRecv, 2, 8);
    let mut p = Program::new("recv-first", c);
    for r in 0..2 {
        p.push(r, 0, Step::Recv { peer: 1 - r, dst: Slice::output(0, 8) });
        p.push(r, 0, Step::Send { peer: 1 - r, src: Slice::input(0, 8) });
    }
    let msg = err(&p);
    assert_has(&msg, &["deadlock", "rank 0 step 0", "rank 1 step 0", "waits for a message from rank"]);
}

#[test]
fn bounded_buffering_deadlock() {
    // Each rank sends twice before receiving: fine with two slots, a
    // deadlock with one.
    let c = Collective::new(CollKind::SendRecv, 2, 8);
    let mut p = Program::new("two-sends", c);
    for r in 0..2 {
        p.push(r, 0, Step::Send { peer: 1 - r, src: Slice::input(0, 4) });
        p.push(r, 0, Step::Send { peer: 1 - r, src: Slice::input(4, 4) });
        p.push(r, 0, Step::Recv { peer: 1 - r, dst: Slice::output(0, 4) });
        p.push(r, 0, Step::Recv { peer: 1 - r, dst: Slice::output(4, 4) });
    }
    verify_with(&p, &VerifyOptions { slots: 2, in_place: false }).unwrap();
    let msg = verify_with(&p, &VerifyOptions { slots: 1, in_place: false }).unwrap_err().to_string();
    assert_has(&msg, &["deadlock", "step 1", "cannot send to rank"]);
}

#[test]
fn forwarding_needs_room_for_the_outgoing_message() {
    // Each rank sends, then receives-reduces-forwards to the same peer: the
    // forward needs room while its own first message still sits in the
    // connection, so one slot deadlocks and two do not.
    let c = Collective::new(CollKind::AllReduce, 2, 1);
    let mut p = Program::new("echo", c);
    for r in 0..2 {
        p.push(r, 0, Step::Send { peer: 1 - r, src: Slice::input(0, 1) });
        p.push(r, 0, Step::RecvReduceSend { recv: 1 - r, send: 1 - r, src: Slice::input(0, 1) });
        p.push(r, 0, Step::Recv { peer: 1 - r, dst: Slice::output(0, 1) });
    }
    let msg = verify_with(&p, &VerifyOptions { slots: 1, in_place: false }).unwrap_err().to_string();
    assert_has(&msg, &["deadlock", "step 1", "cannot send to rank"]);
    // With two slots it runs, and is a correct two-rank all-reduce.
    verify_with(&p, &VerifyOptions::default()).unwrap();
    // The ring's forwarding steps need the same: two slots.
    let p = ring(4, 400);
    let msg = verify_with(&p, &VerifyOptions { slots: 1, in_place: false }).unwrap_err().to_string();
    assert_has(&msg, &["deadlock", "cannot send to rank"]);
    verify_with(&p, &VerifyOptions::default()).unwrap();
}

#[test]
fn partially_overlapping_operands_are_named() {
    let c = Collective::new(CollKind::AllReduce, 2, 2);
    let mut p = Program::new("overlap", c);
    for r in 0..2 {
        p.ranks[r].scratch = 3;
        p.push(r, 0, Step::Send { peer: 1 - r, src: Slice::input(0, 2) });
        p.push(r, 0, Step::Copy { src: Slice::input(0, 2), dst: Slice::scratch(0, 2) });
        p.push(r, 0, Step::RecvReduce { peer: 1 - r, src: Slice::scratch(0, 2), dst: Slice::scratch(1, 2) });
        p.push(r, 0, Step::Copy { src: Slice::scratch(1, 2), dst: Slice::output(0, 2) });
    }
    assert_has(&err(&p), &["rank 0 step 2", "scratch[0..2] and scratch[1..3] partially overlap"]);
    // The same through in-place aliasing: input[0..2] and output[1..3] are
    // one buffer when the call is in place.
    let c = Collective::new(CollKind::AllGather, 2, 2);
    let mut p = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
    p.ranks[0].channels[0].push(Step::Copy { src: Slice::input(0, 2), dst: Slice::output(1, 2) });
    let msg = verify_with(&p, &VerifyOptions { in_place: true, slots: 2 }).unwrap_err().to_string();
    assert_has(&msg, &["rank 0 step", "partially overlap (input and output alias in place)"]);
    let mut p = ring(2, 4);
    p.ranks[0].scratch = 4;
    p.ranks[0].channels[0]
        .push(Step::Reduce { srcs: vec![Slice::output(0, 2), Slice::output(1, 2)], dst: Slice::output(1, 2) });
    assert_has(&err(&p), &["output[0..2] and output[1..3] partially overlap"]);
}

#[test]
fn slices_past_the_address_space_are_named() {
    let mut p = ring(2, 4);
    p.ranks[0].channels[0][0] = Step::Send { peer: 1, src: Slice::input(usize::MAX - 1, 4) };
    assert_has(&err(&p), &["rank 0 step 0", "outside the input buffer of 4 elements"]);
}

#[test]
fn double_count_is_named() {
    let c = Collective::new(CollKind::AllReduce, 2, 4);
    let mut p = Program::new("twice", c);
    for r in 0..2 {
        p.push(r, 0, Step::Send { peer: 1 - r, src: Slice::input(0, 4) });
        p.push(r, 0, Step::RecvReduce { peer: 1 - r, src: Slice::input(0, 4), dst: Slice::output(0, 4) });
    }
    // Rank 1 adds its own input a second time.
    p.push(1, 0, Step::Reduce { srcs: vec![Slice::output(0, 4), Slice::input(0, 4)], dst: Slice::output(0, 4) });
    let msg = err(&p);
    assert_has(&msg, &["rank 1 step 2", "counts rank 1's contribution twice"]);
}

#[test]
fn order_and_length_mismatch_is_named() {
    let c = Collective::new(CollKind::SendRecv, 2, 8);
    let mut p = Program::new("mismatch", c);
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 8) });
    p.push(0, 0, Step::Recv { peer: 1, dst: Slice::output(0, 8) });
    p.push(1, 0, Step::Send { peer: 0, src: Slice::input(0, 8) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(0, 4) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(4, 4) });
    let msg = err(&p);
    assert_has(&msg, &["rank 1 step 1", "expects 4 elements from rank 0", "8 elements from rank 0 step 0"]);
}

#[test]
fn wrong_root_is_named() {
    let c = Collective::new(CollKind::Broadcast, 3, 10).with_root(1);
    let mut p = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
    p.collective.root = 2; // claims another root than the one it implements
    let msg = err(&p);
    assert!(msg.contains("rank 1") || msg.contains("root 2"), "{msg}");
}

#[test]
fn bad_shapes_are_named() {
    let mut p = ring(4, 400);
    p.ranks[3].channels[0][0] = Step::Send { peer: 7, src: Slice::input(0, 100) };
    assert_has(&err(&p), &["rank 3 step 0", "peer 7 is out of range for 4 ranks"]);
    let mut p = ring(4, 400);
    p.ranks[1].channels[0][0] = Step::Send { peer: 1, src: Slice::input(0, 100) };
    assert_has(&err(&p), &["rank 1 step 0", "itself"]);
    let mut p = ring(4, 400);
    p.ranks[0].channels[0][0] = Step::Send { peer: 1, src: Slice::input(350, 100) };
    assert_has(&err(&p), &["rank 0 step 0", "input[350..450] is outside the input buffer of 400"]);
    let mut p = ring(4, 400);
    p.ranks[2].channels[0].push(Step::Copy { src: Slice::output(0, 4), dst: Slice::input(0, 4) });
    assert_has(&err(&p), &["rank 2 step", "writes input[0..4]", "read-only"]);
    let mut p = ring(4, 400);
    p.ranks.pop();
    assert_has(&err(&p), &["programs for 3 ranks", "4"]);
}

#[test]
fn one_sided_race_is_named() {
    // Two-shot all-reduce without its middle barrier: a rank reads a
    // peer's block before the peer finished reducing it.
    let c = Collective::new(CollKind::AllReduce, 3, 30);
    let mut p = build(Algorithm::TwoShot, &c, &BuildOptions::default()).unwrap();
    for rp in &mut p.ranks {
        let steps = &mut rp.channels[0];
        // Steps: 2 signals, 2 waits, 2 get-reduces, then the middle barrier.
        steps.drain(6..10);
    }
    // Which symptom shows first depends on the schedule: the read of a block
    // not yet written, or the race with the write that comes later.
    let msg = err(&p);
    assert_has(&msg, &["step 6", "get rank"]);
    assert!(msg.contains("not ordered before this read") || msg.contains("racing with"), "{msg}");
}

#[test]
fn write_after_signal_races_with_the_peer_read() {
    // Rank 0 publishes its output, signals, then overwrites it while rank 1
    // may still be reading it.
    let c = Collective::new(CollKind::AllGather, 2, 5);
    let mut p = Program::new("overwrite", c);
    p.push(0, 0, Step::Copy { src: Slice::input(0, 5), dst: Slice::output(0, 5) });
    p.push(0, 0, Step::Signal { peer: 1 });
    p.push(0, 0, Step::Copy { src: Slice::input(0, 5), dst: Slice::output(0, 5) });
    p.push(0, 0, Step::Wait { peer: 1 });
    p.push(1, 0, Step::Wait { peer: 0 });
    p.push(1, 0, Step::Get { peer: 0, src: Slice::output(0, 5), dst: Slice::output(0, 5) });
    p.push(1, 0, Step::Signal { peer: 0 });
    let msg = err(&p);
    assert_has(&msg, &["rank 1 step 1", "racing with the write by rank 0 step 2"]);
}

#[test]
fn touching_a_peer_before_it_entered_is_a_race() {
    let c = Collective::new(CollKind::AllToAll, 2, 5);
    let mut p = build(Algorithm::Direct, &c, &BuildOptions::default()).unwrap();
    for rp in &mut p.ranks {
        rp.channels[0].retain(|s| !matches!(s, Step::Signal { .. } | Step::Wait { .. }));
    }
    let msg = err(&p);
    assert_has(&msg, &["rank 0 step 1", "get rank 1's input", "before the collective"]);
}

#[test]
fn leaving_while_a_peer_still_reads_is_named() {
    let c = Collective::new(CollKind::AllReduce, 2, 10);
    let mut p = build(Algorithm::OneShot, &c, &BuildOptions::default()).unwrap();
    for rp in &mut p.ranks {
        // Drop the closing barrier (signal, wait) before the final copy.
        let steps = &mut rp.channels[0];
        let len = steps.len();
        steps.drain(len - 3..len - 1);
    }
    let msg = err(&p);
    assert_has(&msg, &["returns while", "is not ordered before its end"]);
}

#[test]
fn channels_that_write_the_same_elements_race() {
    let c = Collective::new(CollKind::AllReduce, 1, 10);
    let mut p = Program::new("two-channels", c);
    p.push(0, 0, Step::Copy { src: Slice::input(0, 10), dst: Slice::output(0, 10) });
    p.push(0, 1, Step::Copy { src: Slice::input(0, 10), dst: Slice::output(0, 10) });
    let msg = err(&p);
    assert_has(&msg, &["channel 1 step 0", "racing with", "channel 0 step 0"]);
}

#[test]
fn reading_uninitialized_scratch_is_named() {
    let c = Collective::new(CollKind::AllReduce, 1, 10);
    let mut p = Program::new("garbage", c);
    p.ranks[0].scratch = 10;
    p.push(0, 0, Step::Copy { src: Slice::scratch(0, 10), dst: Slice::output(0, 10) });
    assert_has(&err(&p), &["rank 0 step 0", "reads scratch[0..10]", "never written"]);
}

#[test]
fn unwaited_signal_is_named() {
    let c = Collective::new(CollKind::AllReduce, 2, 1);
    let mut p = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
    p.push(0, 0, Step::Signal { peer: 1 });
    assert_has(&err(&p), &["rank 0 step", "signals rank 1, which never waits"]);
}

#[test]
fn in_place_claims_are_checked() {
    // Pairwise all-to-all overwrites blocks it has yet to send when run in
    // place; claiming otherwise is caught.
    let c = Collective::new(CollKind::AllToAll, 3, 4);
    let mut p = build(Algorithm::Pairwise, &c, &BuildOptions::default()).unwrap();
    verify(&p).unwrap();
    p.in_place = true;
    assert_has(&err(&p), &["in place"]);
}
