//! `oxccl_p2p` (cuda/program.cu), groups of sends and receives of device
//! buffers, run on the host by the emulation harness: random groups over
//! 2–6 ranks (several messages between a pair, empty ones, messages of
//! many FIFO pieces, both directions at once, relaunches on the same
//! flags), every received byte compared with what its sender sent; a rank
//! that never runs is a timeout on its peers. Lanes come from
//! `P2pArgs::group`, as on a GPU.

use crate::common;

use common::*;
use oxccl_cuda::program::{P2pArgs, P2pOp};

/// One message: sender, receiver, bytes.
#[derive(Clone)]
struct Msg {
    from: usize,
    to: usize,
    data: Vec<u8>,
}

struct Job {
    n: usize,
    team: u32,
    slots: u32,
    slot_bytes: u64,
    repeat: u32,
    skip: Option<usize>,
    timeout_ms: u64,
    msgs: Vec<Msg>,
    /// Each rank's group: indices into `msgs`, in call order.
    groups: Vec<Vec<usize>>,
}

/// Random messages and, for every rank, its sends and receives in an
/// order that keeps the messages of each (sender, receiver) pair in order
/// (what NCCL's matching promises) but mixes everything else.
fn random_job(rng: &mut Rng, n: usize, nmsgs: usize, max_len: u64) -> Job {
    let mut msgs = Vec::new();
    for _ in 0..nmsgs {
        let from = rng.below(n as u64) as usize;
        let to = (from + 1 + rng.below(n as u64 - 1) as usize) % n;
        let len = if rng.below(6) == 0 { 0 } else { rng.below(max_len) as usize + 1 };
        msgs.push(Msg { from, to, data: (0..len).map(|_| rng.next() as u8).collect() });
    }
    let groups = (0..n)
        .map(|r| {
            let mut mine: Vec<usize> = (0..msgs.len()).filter(|&i| msgs[i].from == r || msgs[i].to == r).collect();
            // A random merge of the per-peer queues (sends and receives apart).
            let mut out = Vec::new();
            while !mine.is_empty() {
                let k = rng.below(mine.len() as u64) as usize;
                let m = &msgs[mine[k]];
                let key = (m.from, m.to);
                let first = mine.iter().position(|&i| (msgs[i].from, msgs[i].to) == key).unwrap();
                out.push(mine.remove(first));
            }
            out
        })
        .collect();
    Job { n, team: 1, slots: 2, slot_bytes: 64, repeat: 1, skip: None, timeout_ms: 20_000, msgs, groups }
}

/// Per rank: (status, guards intact, every receive as (message, bytes)).
type Got = Vec<(u32, bool, Vec<(usize, Vec<u8>)>)>;

fn run(jobs: &[Job]) -> Option<Vec<Got>> {
    let exe = harness()?;
    let mut input = Vec::new();
    let mut orders = Vec::new();
    for j in jobs {
        input.extend_from_slice(
            format!(
                "p2p {} {} 8 {} {} 1 {} {} {}\n",
                j.n,
                j.team,
                j.slots,
                j.slot_bytes,
                j.timeout_ms * 1_000_000,
                j.repeat,
                j.skip.map_or(-1, |r| r as i64)
            )
            .as_bytes(),
        );
        let mut per = Vec::new();
        for (r, g) in j.groups.iter().enumerate() {
            let ops: Vec<P2pOp> = g
                .iter()
                .map(|&i| {
                    let m = &j.msgs[i];
                    let send = m.from == r;
                    P2pOp { send, peer: if send { m.to } else { m.from }, addr: 0, len: m.data.len() as u64 }
                })
                .collect();
            let (a, order) = P2pArgs::group(&ops, r, j.n).unwrap();
            let nl = a.nlanes as usize;
            input.extend_from_slice(&(nl as u64).to_le_bytes());
            input.extend_from_slice(&(ops.len() as u64).to_le_bytes());
            for table in [&a.lane_first, &a.lane_ops, &a.lane_peer, &a.lane_send] {
                for x in &table[..nl] {
                    input.extend_from_slice(&x.to_le_bytes());
                }
            }
            for &k in &order {
                input.extend_from_slice(&ops[k].len.to_le_bytes());
            }
            for &k in &order {
                if ops[k].send {
                    input.extend_from_slice(&j.msgs[g[k]].data);
                }
            }
            // The receives in lane order, as the harness answers them.
            per.push(order.iter().map(|&k| g[k]).filter(|&i| j.msgs[i].to == r).collect::<Vec<_>>());
        }
        orders.push(per);
    }
    let answers = run_jobs(exe, input);
    Some(
        answers
            .iter()
            .zip(jobs.iter().zip(&orders))
            .map(|(a, (j, per))| {
                let mut at = 0;
                (0..j.n)
                    .map(|r| {
                        let w = |i: usize| u32::from_ne_bytes(a.data[at + 4 * i..at + 4 * i + 4].try_into().unwrap());
                        let (status, guards) = (w(0), w(1) == 1);
                        at += 8;
                        let got = per[r]
                            .iter()
                            .map(|&i| {
                                let len = j.msgs[i].data.len();
                                at += len;
                                (i, a.data[at - len..at].to_vec())
                            })
                            .collect();
                        (status, guards, got)
                    })
                    .collect()
            })
            .collect(),
    )
}

/// Every message rank `r` receives landed whole in its own buffer.
fn check_received(j: &Job, r: usize, got: &[(usize, Vec<u8>)]) {
    let expected = j.msgs.iter().filter(|m| m.to == r).count();
    assert_eq!(got.len(), expected, "{} ranks: rank {r}'s receives", j.n);
    for (i, bytes) in got {
        let m = &j.msgs[*i];
        assert!(*bytes == m.data, "{} ranks: rank {r}'s receive of message {i} from {} differs", j.n, m.from);
    }
}

#[test]
fn random_groups_deliver_every_byte_in_order() {
    let mut rng = Rng(0xabcd);
    let mut jobs = Vec::new();
    for (i, n) in [2, 3, 4, 5, 6, 2, 3, 4].into_iter().enumerate() {
        let mut j = random_job(&mut rng, n, 3 + 2 * n, [100, 700, 3000][i % 3]);
        j.team = [1, 2, 3][i % 3];
        j.slots = [2, 1, 4][i % 3];
        j.slot_bytes = [64, 16, 256][(i / 2) % 3];
        j.repeat = 1 + (i % 2) as u32;
        jobs.push(j);
    }
    let Some(res) = run(&jobs) else { return };
    for (j, ranks) in jobs.iter().zip(&res) {
        for (r, (status, guards, got)) in ranks.iter().enumerate() {
            assert_eq!((*status, *guards), (0, true), "{} ranks: rank {r}'s status and guards", j.n);
            check_received(j, r, got);
        }
    }
}

#[test]
fn every_pair_exchanging_at_once_does_not_deadlock() {
    // All-to-all-v: every rank sends to and receives from every other, the
    // sends first in every group, messages of many pieces.
    let n = 5;
    let mut rng = Rng(99);
    let mut msgs = Vec::new();
    for from in 0..n {
        for to in (0..n).filter(|&t| t != from) {
            let len = 300 + rng.below(500) as usize;
            msgs.push(Msg { from, to, data: (0..len).map(|_| rng.next() as u8).collect() });
        }
    }
    let groups = (0..n)
        .map(|r| {
            let sends = (0..msgs.len()).filter(|&i| msgs[i].from == r);
            sends.chain((0..msgs.len()).filter(|&i| msgs[i].to == r)).collect()
        })
        .collect();
    let job = Job { n, team: 2, slots: 2, slot_bytes: 32, repeat: 2, skip: None, timeout_ms: 20_000, msgs, groups };
    let Some(res) = run(std::slice::from_ref(&job)) else { return };
    for (r, (status, guards, got)) in res[0].iter().enumerate() {
        assert_eq!((*status, *guards), (0, true), "rank {r}");
        check_received(&job, r, got);
    }
}

#[test]
fn a_missing_peer_is_a_timeout() {
    let mut rng = Rng(5);
    let mut j = random_job(&mut rng, 3, 0, 1);
    // 1000 bytes: more than the FIFO holds (2 slots of 64).
    j.msgs = vec![Msg { from: 0, to: 1, data: vec![1; 1000] }, Msg { from: 2, to: 0, data: vec![2; 10] }];
    j.groups = vec![vec![0, 1], vec![0], vec![1]];
    j.skip = Some(1);
    j.timeout_ms = 200;
    let Some(res) = run(std::slice::from_ref(&j)) else { return };
    // Rank 0's send to the missing rank 1 fills the FIFO and times out;
    // rank 2's send to rank 0 completes.
    assert_eq!(res[0][0].0, 1, "rank 0 times out waiting for rank 1");
    assert_eq!(res[0][2].0, 0, "rank 2's message went through");
}
