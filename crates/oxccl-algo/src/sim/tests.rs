//! Unit tests of the simulator on small hand-written programs.

use super::*;
use crate::cost::Link;
use crate::ir::Slice;
use crate::{CollKind, Collective};

const L: Link = Link::new(1e9, 1e-6);

fn prog(n: usize) -> Program {
    Program::new("hand", Collective::new(CollKind::SendRecv, n, 1000))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-30)
}

fn send(p: &mut Program, from: usize, to: usize, ch: usize, elems: usize) {
    p.push(from, ch, Step::Send { peer: to, src: Slice::input(0, elems) });
    p.push(to, ch, Step::Recv { peer: from, dst: Slice::output(0, elems) });
}

#[test]
fn one_message_costs_alpha_plus_beta() {
    let mut p = prog(2);
    send(&mut p, 0, 1, 0, 1000);
    let r = simulate(&p, &Topology::single_node(2, L)).unwrap();
    assert!(close(r.time, 1e-6 + 4000e-9), "{}", r.time);
    assert!(close(r.rank_finish[0], 4000e-9) && close(r.rank_finish[1], r.time));
    assert_eq!((r.intra_bytes, r.inter_bytes, r.messages, r.steps), (4000, 0, 1, 2));
}

#[test]
fn nic_is_shared_by_the_ranks_of_a_node() {
    // Rank i of node 0 sends to rank i of node 1: eight transfers queue
    // on one NIC, so each byte takes 8× as long as with one rank a node.
    let per_node = |rpn: usize| {
        let mut p = prog(2 * rpn);
        for i in 0..rpn {
            send(&mut p, i, rpn + i, 0, 1 << 20);
        }
        let r = simulate(&p, &Topology::new(2, rpn, Link::new(1e12, 0.0), L)).unwrap();
        assert_eq!(r.inter_bytes, (rpn as u64 * 4) << 20);
        r.time - L.lat
    };
    let (one, eight) = (per_node(1), per_node(8));
    assert!(close(one, 4.0 * (1 << 20) as f64 / 1e9), "{one}");
    assert!(close(eight, 8.0 * one), "{eight} vs {one}");
    // Within a node every rank has its own ports: no queueing.
    let mut p = prog(16);
    for i in 0..8 {
        send(&mut p, i, 8 + i, 0, 1 << 20);
    }
    let r = simulate(&p, &Topology::single_node(16, L)).unwrap();
    assert!(close(r.time - L.lat, one), "{}", r.time);
}

#[test]
fn channels_of_a_rank_share_its_ports() {
    let mut p = prog(2);
    send(&mut p, 0, 1, 0, 1000);
    send(&mut p, 0, 1, 1, 1000);
    let r = simulate(&p, &Topology::single_node(2, L)).unwrap();
    assert!(close(r.time, 1e-6 + 8000e-9), "{}", r.time);
}

#[test]
fn reductions_and_copies_cost_gamma() {
    let mut p = prog(2);
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 1000) });
    p.push(1, 0, Step::RecvReduce { peer: 0, src: Slice::input(0, 1000), dst: Slice::output(0, 1000) });
    p.push(1, 0, Step::Reduce { srcs: vec![Slice::output(0, 1000); 3], dst: Slice::output(0, 1000) });
    p.push(1, 0, Step::Copy { src: Slice::output(0, 1000), dst: Slice::scratch(0, 1000) });
    let topo = Topology::single_node(2, L).with_reduce_bw(2e9).with_copy_bw(4e9);
    let r = simulate(&p, &topo).unwrap();
    let want = 1e-6 + 4000e-9 + 4000.0 / 2e9 + 2.0 * 4000.0 / 2e9 + 4000.0 / 4e9;
    assert!(close(r.time, want), "{} vs {want}", r.time);
}

#[test]
fn one_sided_reads_overlap_and_signals_follow_them() {
    // Rank 0 reads 1000 floats from each of ranks 1..4: the reads queue
    // on rank 0's receive port and pay the latency once; then it signals
    // rank 1, which waits for it.
    let mut p = prog(4);
    for q in 1..4 {
        p.push(
            0,
            0,
            Step::GetReduce {
                peer: q,
                src: Slice::input(0, 1000),
                acc: Slice::output(0, 1000),
                dst: Slice::output(0, 1000),
            },
        );
    }
    p.push(0, 0, Step::Signal { peer: 1 });
    p.push(1, 0, Step::Wait { peer: 0 });
    let r = simulate(&p, &Topology::single_node(4, L)).unwrap();
    assert!(close(r.rank_finish[0], 1e-6 + 3.0 * 4000e-9), "{}", r.rank_finish[0]);
    assert!(close(r.rank_finish[1], 2e-6 + 3.0 * 4000e-9), "{}", r.rank_finish[1]);
    assert_eq!((r.intra_bytes, r.messages), (12000, 1));
    // A put holds the writer's send port; the writer moves on when the
    // bytes have left, and finishes when they have arrived.
    let mut p = prog(2);
    p.push(0, 0, Step::Put { peer: 1, src: Slice::input(0, 1000), dst: Slice::output(0, 1000) });
    p.push(0, 0, Step::Put { peer: 1, src: Slice::input(0, 1000), dst: Slice::output(0, 1000) });
    let r = simulate(&p, &Topology::single_node(2, L)).unwrap();
    assert!(close(r.time, 1e-6 + 8000e-9), "{}", r.time);
}

#[test]
fn staggered_reads_do_not_block_each_other() {
    // Rank r reads from r+1, then r+2 (mod 3): every port carries one
    // transfer at a time, so the reads take two transfer times. A read
    // waiting for its own receive port must not claim a peer's send port
    // ahead of a reader that can use it now (which would chain the ranks
    // up to five transfer times).
    let mut p = prog(3);
    for r in 0..3 {
        for k in 1..3 {
            p.push(r, 0, Step::Get { peer: (r + k) % 3, src: Slice::input(0, 1000), dst: Slice::output(0, 1000) });
        }
    }
    let r = simulate(&p, &Topology::single_node(3, L)).unwrap();
    assert!(close(r.time, 1e-6 + 2.0 * 4000e-9), "{}", r.time);
    // All reading rank 0 first: they queue at its port, in rank order.
    let mut p = prog(3);
    for r in 1..3 {
        p.push(r, 0, Step::Get { peer: 0, src: Slice::input(0, 1000), dst: Slice::output(0, 1000) });
    }
    let r = simulate(&p, &Topology::single_node(3, L)).unwrap();
    assert!(close(r.rank_finish[1], 1e-6 + 4000e-9) && close(r.rank_finish[2], 1e-6 + 8000e-9), "{r:?}");
}

#[test]
fn deadlocks_name_the_blocked_steps() {
    let mut p = prog(2);
    p.push(0, 0, Step::Recv { peer: 1, dst: Slice::output(0, 10) });
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 10) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(0, 10) });
    p.push(1, 0, Step::Send { peer: 0, src: Slice::input(0, 10) });
    let e = simulate(&p, &Topology::single_node(2, L)).unwrap_err().to_string();
    assert!(e.contains("deadlocks") && e.contains("rank 0 channel 0 step 0") && e.contains("rank 1"), "{e}");
    assert!(e.contains("recv output[0..10] from 1"), "{e}");
}

#[test]
fn unpaired_messages_are_errors() {
    let mut p = prog(3);
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 10) });
    p.push(0, 0, Step::Send { peer: 1, src: Slice::input(0, 10) });
    p.push(1, 0, Step::Recv { peer: 0, dst: Slice::output(0, 10) });
    let e = simulate(&p, &Topology::single_node(3, L)).unwrap_err().to_string();
    assert!(e.contains("rank 0 sends 2 messages to rank 1 on channel 0, but rank 1 receives 1"), "{e}");
    let mut p = prog(3);
    p.push(2, 0, Step::Recv { peer: 0, dst: Slice::output(0, 10) });
    let e = simulate(&p, &Topology::single_node(3, L)).unwrap_err().to_string();
    assert!(e.contains("rank 2 channel 0 step 0") && e.contains("rank 0 sends nothing"), "{e}");
    let mut p = prog(3);
    p.push(2, 1, Step::Wait { peer: 0 });
    let e = simulate(&p, &Topology::single_node(3, L)).unwrap_err().to_string();
    assert!(e.contains("never signals"), "{e}");
    let mut p = prog(3);
    p.push(1, 0, Step::Send { peer: 7, src: Slice::input(0, 10) });
    let e = simulate(&p, &Topology::single_node(3, L)).unwrap_err().to_string();
    assert!(e.contains("peer 7 is out of range"), "{e}");
    let e = simulate(&prog(3), &Topology::single_node(4, L)).unwrap_err().to_string();
    assert!(e.contains("3 ranks but the topology has 4"), "{e}");
}

#[test]
fn hand_written_json_is_priced() {
    let p = Program::from_json(
        r#"{
          "name": "pair-exchange",
          "collective": {"kind": "all_gather", "nranks": 2, "count": 256, "dtype": "float64"},
          "ranks": [
            {"channels": [[{"op": "send", "peer": 1, "src": "input[0..256]"},
                           {"op": "recv", "peer": 1, "dst": "output[256..512]"}]]},
            {"channels": [[{"op": "recv", "peer": 0, "dst": "output[0..256]"},
                           {"op": "send", "peer": 0, "src": "input[0..256]"}]]}
          ]
        }"#,
    )
    .unwrap();
    let r = simulate(&p, &Topology::one_rank_per_node(2, L)).unwrap();
    // Rank 1 sends only after its receive: two messages back to back.
    let m = 2048e-9 + 1e-6;
    assert!(close(r.rank_finish[0], 2.0 * m) && close(r.rank_finish[1], m + 2048e-9), "{r:?}");
    assert_eq!((r.inter_bytes, r.intra_bytes), (4096, 0));
    assert_eq!(simulate(&p, &Topology::one_rank_per_node(2, L)).unwrap(), r);
}

#[test]
fn decoding_agrees_with_the_ir() {
    let s = Slice::input(0, 7);
    let d = Slice::output(0, 7);
    let steps = [
        Step::Send { peer: 1, src: s },
        Step::Recv { peer: 1, dst: d },
        Step::RecvReduce { peer: 1, src: s, dst: d },
        Step::RecvReduceSend { recv: 1, send: 2, src: s },
        Step::RecvCopySend { recv: 1, send: 2, dst: d },
        Step::RecvReduceCopySend { recv: 1, send: 2, src: s, dst: d },
        Step::Copy { src: s, dst: d },
        Step::Reduce { srcs: vec![s, d, d], dst: d },
        Step::Put { peer: 1, src: s, dst: d },
        Step::Get { peer: 1, src: s, dst: d },
        Step::GetReduce { peer: 1, src: s, acc: d, dst: d },
        Step::Signal { peer: 1 },
        Step::Wait { peer: 1 },
    ];
    for step in &steps {
        let (recv, (_, peer, elems), reduce, _) = compile::decode(step);
        assert_eq!(recv.map(|(q, _)| q), step.recv_peer().or(matches!(step, Step::Wait { .. }).then_some(1)));
        if step.send_peer().is_some() || (step.is_one_sided() && !matches!(step, Step::Wait { .. })) {
            assert_eq!(peer, step.send_peer().or(step.one_sided_peer()).unwrap(), "{step}");
            assert_eq!(elems, step.wire_elems(), "{step}");
        }
        assert_eq!(reduce, step.reduce_elems(), "{step}");
    }
}

#[test]
fn a_reused_simulator_gives_the_same_reports() {
    use crate::algos::{Algorithm, BuildOptions, build};
    let topo = Topology::new(3, 4, L, Link::new(2e8, 5e-6));
    let mut sim = Simulator::new();
    for algo in [Algorithm::Tree, Algorithm::Ring, Algorithm::Rhd, Algorithm::OneShot, Algorithm::Tree] {
        let c = Collective::new(CollKind::AllReduce, 12, 10_000);
        let p = build(algo, &c, &BuildOptions { chunk_bytes: 300 * 4, max_chunks: 16 }).unwrap();
        assert_eq!(sim.simulate(&p, &topo).unwrap(), simulate(&p, &topo).unwrap(), "{algo}");
    }
    // An error leaves the simulator usable.
    assert!(sim.simulate(&prog(5), &topo).is_err());
    let mut p = prog(12);
    send(&mut p, 0, 11, 0, 1000);
    assert!(close(sim.simulate(&p, &topo).unwrap().time, 5e-6 + 4000.0 / 2e8));
}

/// A ring all-reduce of `bytes` on `topo`'s ranks (numbered blocked), cut
/// into `c` channels.
fn ring_on(topo: &Topology, bytes: usize, c: usize) -> Program {
    use crate::algos::{Algorithm, BuildOptions};
    let coll = Collective::new(CollKind::AllReduce, topo.nranks(), bytes / 4);
    let at = crate::placement::Placement::blocked(topo.nodes, topo.ranks_per_node);
    crate::channels::build(Algorithm::Ring, &coll, &BuildOptions::default(), &at, c).unwrap()
}

/// A fast node and a slow network: NIC-bound.
const NIC: Link = Link::new(1e9, 10e-6);
const NVL: Link = Link::new(100e9, 1e-6);

#[test]
fn channels_between_one_pair_are_connections_of_their_own() {
    // Two channels from rank 0 to rank 1 across nodes with two NICs:
    // by channel they take a NIC each and both arrive after one transfer;
    // by rank they queue on local rank 0's NIC.
    let mut p = prog(2);
    send(&mut p, 0, 1, 0, 1000);
    send(&mut p, 0, 1, 1, 1000);
    let topo = Topology::one_rank_per_node(2, L).with_nics(2);
    let by_rank = simulate(&p, &topo).unwrap();
    let by_channel = simulate(&p, &topo.rails_by_channel()).unwrap();
    assert!(close(by_channel.time, 1e-6 + 4000e-9), "{}", by_channel.time);
    assert!(close(by_rank.time, 1e-6 + 8000e-9), "{}", by_rank.time);
    assert!(close(by_channel.nic_busy, 4000e-9) && close(by_rank.nic_busy, 8000e-9));
    // Node 0's NICs send, node 1's receive; by rank NIC 1 stays idle.
    assert_eq!(by_channel.nics.len(), 4);
    assert!(close(by_channel.nics[0].0, 4000e-9) && close(by_channel.nics[1].0, 4000e-9), "{:?}", by_channel.nics);
    assert!(close(by_channel.nics[2].1, 4000e-9) && close(by_channel.nics[3].1, 4000e-9), "{:?}", by_channel.nics);
    assert_eq!((by_rank.nics[1], by_rank.nics[3]), ((0.0, 0.0), (0.0, 0.0)));
}

#[test]
fn rails_by_channel_halve_a_nic_bound_ring() {
    // 2 nodes × 2 ranks, 2 NICs each, 16 MiB: the ring crosses from
    // local rank 1 to local rank 0 both ways.
    let topo = Topology::new(2, 2, NVL, NIC).with_nics(2);
    let (one, two) = (ring_on(&topo, 16 << 20, 1), ring_on(&topo, 16 << 20, 2));
    let base = simulate(&one, &topo).unwrap();
    assert!(matches!(base.bound(), Bound::Nic(x) if x > 0.95), "{:?}", base.bound());
    // One channel takes rail 0 by channel and NICs 1 → 0 by rank: one
    // NIC side each way either way, the same time.
    let one_by_channel = simulate(&one, &topo.rails_by_channel()).unwrap();
    assert!(close(one_by_channel.time, base.time), "{} vs {}", one_by_channel.time, base.time);
    // By rank both channels still share those NICs: no faster.
    let by_rank = simulate(&two, &topo).unwrap();
    assert!(by_rank.time > 0.95 * base.time, "{} vs {}", by_rank.time, base.time);
    // By channel each takes a rail: about half the time.
    let by_channel = simulate(&two, &topo.rails_by_channel()).unwrap();
    let speedup = base.time / by_channel.time;
    assert!((1.9..=2.05).contains(&speedup), "{speedup}: {} vs {}", base.time, by_channel.time);
    assert!(close(by_channel.nic_busy, base.nic_busy / 2.0), "{} vs {}", by_channel.nic_busy, base.nic_busy);
    assert_eq!(by_channel.inter_bytes, base.inter_bytes);
    // The bytes split evenly over every NIC's both sides.
    let each = by_channel.inter_bytes as f64 / NIC.bw / 4.0;
    assert!(by_channel.nics.iter().all(|&(tx, rx)| close(tx, each) && close(rx, each)), "{:?}", by_channel.nics);
    // By rank one local rank's NIC sends and the other's receives: every
    // NIC carries one direction, whatever the channel.
    assert!(by_rank.nics.iter().all(|&(tx, rx)| (tx == 0.0) != (rx == 0.0)), "{:?}", by_rank.nics);
}

#[test]
fn rails_by_rank_leave_the_second_nic_idle_with_one_rank_per_node() {
    let topo = Topology::new(2, 1, NVL, NIC).with_nics(2);
    let p = ring_on(&topo, 8 << 20, 2);
    let by_rank = simulate(&p, &topo).unwrap();
    assert_eq!((by_rank.nics[1], by_rank.nics[3]), ((0.0, 0.0), (0.0, 0.0)), "{:?}", by_rank.nics);
    let half = by_rank.inter_bytes as f64 / NIC.bw / 2.0;
    assert!(close(by_rank.nics[0].0, half) && close(by_rank.nics[2].1, half), "{:?}", by_rank.nics);
    let by_channel = simulate(&p, &topo.rails_by_channel()).unwrap();
    assert!(by_channel.nics.iter().all(|&(tx, rx)| close(tx, half / 2.0) && close(rx, half / 2.0)));
    assert!(by_channel.time < 0.55 * by_rank.time, "{} vs {}", by_channel.time, by_rank.time);
}

#[test]
fn rails_matter_only_with_several_nics() {
    // With one NIC a node, or one node, the choice changes nothing, bit
    // for bit.
    for topo in [Topology::new(2, 2, NVL, NIC), Topology::single_node(4, NVL).with_nics(2)] {
        let p = ring_on(&topo, 1 << 20, 2);
        assert_eq!(simulate(&p, &topo).unwrap(), simulate(&p, &topo.rails_by_channel()).unwrap(), "{topo}");
    }
    let t = Topology::new(2, 4, NVL, NIC).with_nics(2);
    assert_eq!((t.nic_for(5, 0), t.nic_for(5, 7), t.nic_of(5)), (3, 3, 3));
    let t = t.rails_by_channel();
    assert_eq!((t.nic_for(5, 0), t.nic_for(5, 7), t.nic_for(0, 3)), (2, 3, 1));
    assert!(t.to_string().contains("× 2 NICs (rails by channel)"), "{t}");
}

#[test]
fn rails_by_sender_are_the_transports_rails() {
    let topo = Topology::new(2, 2, NVL, NIC).with_nics(2);
    let s = topo.with_rails(crate::cost::Rails::BySender);
    // Channel c of local rank i's sends: NIC (c + i) mod 2 of both nodes
    // (node 1's NICs are 2 and 3).
    assert_eq!(s.nics_between(1, 2, 0), (1, 3));
    assert_eq!(s.nics_between(1, 2, 1), (0, 2));
    assert_eq!(s.nics_between(2, 1, 0), (2, 0));
    assert!(s.to_string().contains("(rails by channel and sender)"), "{s}");
    // The ring's crossings leave local rank 1 both ways: one channel keeps
    // to rail 1, two channels take both rails and about half the time.
    let base = simulate(&ring_on(&topo, 16 << 20, 1), &s).unwrap();
    let one_by_rank = simulate(&ring_on(&topo, 16 << 20, 1), &topo).unwrap();
    assert!(close(base.time, one_by_rank.time), "{} vs {}", base.time, one_by_rank.time);
    let two = simulate(&ring_on(&topo, 16 << 20, 2), &s).unwrap();
    let speedup = base.time / two.time;
    assert!((1.9..=2.05).contains(&speedup), "{speedup}: {} vs {}", base.time, two.time);
    let each = two.inter_bytes as f64 / NIC.bw / 4.0;
    assert!(two.nics.iter().all(|&(tx, rx)| close(tx, each) && close(rx, each)), "{:?}", two.nics);
}
