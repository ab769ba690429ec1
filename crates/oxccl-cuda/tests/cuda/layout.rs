//! The Rust mirrors of `cuda/args.h` have the C layout: a small C program
//! compiled with the system's C compiler (`$CC`, else `cc`) prints every
//! field's offset and size, both structs' sizes and every constant; they must
//! equal `offset_of!`/`size_of` and the Rust constants. Skipped with a message
//! if there is no C compiler, a failure instead where `OXCCL_REQUIRE_CC` is
//! set (CI).

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

const PROGRAM: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include "args.h"
#define F(S, f) printf(#S "." #f " %zu %zu\n", offsetof(struct S, f), sizeof(((struct S *)0)->f));
#define C(name) printf(#name " %lld\n", (long long)(name));
int main(void) {
    printf("oxccl_reduce_args %zu %zu\n", sizeof(struct oxccl_reduce_args), _Alignof(struct oxccl_reduce_args));
    F(oxccl_reduce_args, srcs) F(oxccl_reduce_args, dsts) F(oxccl_reduce_args, count)
    F(oxccl_reduce_args, scale) F(oxccl_reduce_args, nsrcs) F(oxccl_reduce_args, ndsts)
    F(oxccl_reduce_args, premul) F(oxccl_reduce_args, avg_div)
    printf("oxccl_coll_args %zu %zu\n", sizeof(struct oxccl_coll_args), _Alignof(struct oxccl_coll_args));
    F(oxccl_coll_args, window) F(oxccl_coll_args, flags) F(oxccl_coll_args, send) F(oxccl_coll_args, recv)
    F(oxccl_coll_args, count) F(oxccl_coll_args, window_bytes) F(oxccl_coll_args, timeout_ns)
    F(oxccl_coll_args, status) F(oxccl_coll_args, scale) F(oxccl_coll_args, nranks) F(oxccl_coll_args, rank)
    F(oxccl_coll_args, root) F(oxccl_coll_args, coll) F(oxccl_coll_args, premul) F(oxccl_coll_args, avg)
    F(oxccl_coll_args, pad0) F(oxccl_coll_args, pad1)
    printf("oxccl_pstep %zu %zu\n", sizeof(struct oxccl_pstep), _Alignof(struct oxccl_pstep));
    F(oxccl_pstep, op) F(oxccl_pstep, recv) F(oxccl_pstep, send) F(oxccl_pstep, nsrc) F(oxccl_pstep, len)
    F(oxccl_pstep, dst) F(oxccl_pstep, src) F(oxccl_pstep, acc)
    printf("oxccl_prog_args %zu %zu\n", sizeof(struct oxccl_prog_args), _Alignof(struct oxccl_prog_args));
    F(oxccl_prog_args, bufs) F(oxccl_prog_args, fifo) F(oxccl_prog_args, flags) F(oxccl_prog_args, steps)
    F(oxccl_prog_args, slices) F(oxccl_prog_args, slot_bytes) F(oxccl_prog_args, timeout_ns)
    F(oxccl_prog_args, status) F(oxccl_prog_args, chan_first) F(oxccl_prog_args, chan_steps)
    F(oxccl_prog_args, nranks) F(oxccl_prog_args, rank) F(oxccl_prog_args, nchan) F(oxccl_prog_args, fifo_chans)
    F(oxccl_prog_args, slots) F(oxccl_prog_args, team) F(oxccl_prog_args, exchange) F(oxccl_prog_args, seq)
    printf("oxccl_p2p_args %zu %zu\n", sizeof(struct oxccl_p2p_args), _Alignof(struct oxccl_p2p_args));
    F(oxccl_p2p_args, fifo) F(oxccl_p2p_args, flags) F(oxccl_p2p_args, addr) F(oxccl_p2p_args, len)
    F(oxccl_p2p_args, slot_bytes) F(oxccl_p2p_args, timeout_ns) F(oxccl_p2p_args, status)
    F(oxccl_p2p_args, lane_first) F(oxccl_p2p_args, lane_ops) F(oxccl_p2p_args, lane_peer)
    F(oxccl_p2p_args, lane_send) F(oxccl_p2p_args, nranks) F(oxccl_p2p_args, rank) F(oxccl_p2p_args, nlanes)
    F(oxccl_p2p_args, fifo_chans) F(oxccl_p2p_args, slots) F(oxccl_p2p_args, team) F(oxccl_p2p_args, pad0)
    F(oxccl_p2p_args, pad1) C(OXCCL_MAX_P2P)
    C(OXCCL_MAX_CHANNELS) C(OXCCL_MAX_TEAM) C(OXCCL_PF_WORDS) C(OXCCL_PROG_FLAG_BYTES) C(OXCCL_SLICE_BUF_SHIFT)
    C(OXCCL_PS_SEND) C(OXCCL_PS_RECV) C(OXCCL_PS_RECV_REDUCE) C(OXCCL_PS_RECV_REDUCE_SEND)
    C(OXCCL_PS_RECV_COPY_SEND) C(OXCCL_PS_RECV_REDUCE_COPY_SEND) C(OXCCL_PS_COPY) C(OXCCL_PS_REDUCE)
    C(OXCCL_PS_PUT) C(OXCCL_PS_GET) C(OXCCL_PS_GET_REDUCE) C(OXCCL_PS_SIGNAL) C(OXCCL_PS_WAIT)
    C(OXCCL_MAX_SRCS) C(OXCCL_MAX_RANKS) C(OXCCL_MAX_BLOCKS) C(OXCCL_FLAG_BYTES)
    C(OXCCL_STATUS_OK) C(OXCCL_STATUS_TIMEOUT) C(OXCCL_STATUS_ABORTED)
    C(OXCCL_COLL_ALL_REDUCE_ONE_SHOT) C(OXCCL_COLL_ALL_REDUCE_TWO_SHOT) C(OXCCL_COLL_REDUCE_SCATTER)
    C(OXCCL_COLL_ALL_GATHER) C(OXCCL_COLL_BROADCAST) C(OXCCL_COLL_REDUCE) C(OXCCL_COLL_ALL_TO_ALL)
    return 0;
}
"#;

/// Compiles and runs PROGRAM; `None` (after printing why) without a C
/// compiler, a failure instead where `OXCCL_REQUIRE_CC` is set.
fn c_layout() -> Option<HashMap<String, Vec<u64>>> {
    let cuda = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cuda");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, PROGRAM).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = match Command::new(&cc).arg("-std=c11").arg("-I").arg(&cuda).arg(&src).arg("-o").arg(&exe).output() {
        Ok(out) => out,
        Err(e) => {
            oxccl_skip::skip_or_fail("OXCCL_REQUIRE_CC", format!("no C compiler ({cc}: {e})"));
            return None;
        }
    };
    assert!(out.status.success(), "{cc} failed on args.h:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(run.stdout).unwrap();
    Some(
        text.lines()
            .map(|l| {
                let mut w = l.split_whitespace();
                let name = w.next().unwrap().to_string();
                (name, w.map(|n| n.parse().unwrap()).collect())
            })
            .collect(),
    )
}

/// (name, [offset, size]) of each listed field of `$t`, named as the C program prints it.
macro_rules! fields {
    ($c:literal, $t:ty: $($f:ident),+) => {
        vec![$((
            concat!($c, ".", stringify!($f)),
            vec![offset_of!($t, $f) as u64, std::mem::size_of_val(&<$t>::default().$f) as u64],
        )),+]
    };
}

#[test]
fn rust_mirrors_match_the_c_header() {
    use oxccl_cuda::*;
    let Some(c) = c_layout() else { return };
    let mut rust: Vec<(&str, Vec<u64>)> = Vec::new();
    rust.push(("oxccl_reduce_args", vec![size_of::<ReduceArgs>() as u64, align_of::<ReduceArgs>() as u64]));
    rust.extend(fields!("oxccl_reduce_args", ReduceArgs: srcs, dsts, count, scale, nsrcs, ndsts, premul, avg_div));
    rust.push(("oxccl_coll_args", vec![size_of::<CollArgs>() as u64, align_of::<CollArgs>() as u64]));
    rust.extend(fields!("oxccl_coll_args", CollArgs: window, flags, send, recv, count, window_bytes, timeout_ns,
        status, scale, nranks, rank, root, coll, premul, avg, pad0, pad1));
    use oxccl_cuda::program::*;
    rust.push(("oxccl_pstep", vec![size_of::<PStep>() as u64, align_of::<PStep>() as u64]));
    rust.extend(fields!("oxccl_pstep", PStep: op, recv, send, nsrc, len, dst, src, acc));
    rust.push(("oxccl_prog_args", vec![size_of::<ProgArgs>() as u64, align_of::<ProgArgs>() as u64]));
    rust.extend(fields!("oxccl_prog_args", ProgArgs: bufs, fifo, flags, steps, slices, slot_bytes, timeout_ns,
        status, chan_first, chan_steps, nranks, rank, nchan, fifo_chans, slots, team, exchange, seq));
    rust.push(("oxccl_p2p_args", vec![size_of::<P2pArgs>() as u64, align_of::<P2pArgs>() as u64]));
    rust.extend(fields!("oxccl_p2p_args", P2pArgs: fifo, flags, addr, len, slot_bytes, timeout_ns, status,
        lane_first, lane_ops, lane_peer, lane_send, nranks, rank, nlanes, fifo_chans, slots, team, pad0, pad1));
    rust.push(("OXCCL_MAX_P2P", vec![MAX_P2P as u64]));
    let ops = [
        StepOp::Send,
        StepOp::Recv,
        StepOp::RecvReduce,
        StepOp::RecvReduceSend,
        StepOp::RecvCopySend,
        StepOp::RecvReduceCopySend,
        StepOp::Copy,
        StepOp::Reduce,
        StepOp::Put,
        StepOp::Get,
        StepOp::GetReduce,
        StepOp::Signal,
        StepOp::Wait,
    ];
    let names = [
        "SEND",
        "RECV",
        "RECV_REDUCE",
        "RECV_REDUCE_SEND",
        "RECV_COPY_SEND",
        "RECV_REDUCE_COPY_SEND",
        "COPY",
        "REDUCE",
        "PUT",
        "GET",
        "GET_REDUCE",
        "SIGNAL",
        "WAIT",
    ];
    let op_names: Vec<String> = names.iter().map(|n| format!("OXCCL_PS_{n}")).collect();
    for (name, op) in op_names.iter().zip(ops) {
        rust.push((name.as_str(), vec![op as u64]));
    }
    rust.extend([
        ("OXCCL_MAX_CHANNELS", vec![MAX_CHANNELS as u64]),
        ("OXCCL_MAX_TEAM", vec![MAX_TEAM as u64]),
        ("OXCCL_PF_WORDS", vec![PF_WORDS as u64]),
        ("OXCCL_PROG_FLAG_BYTES", vec![PROG_FLAG_BYTES as u64]),
        ("OXCCL_SLICE_BUF_SHIFT", vec![SLICE_BUF_SHIFT as u64]),
    ]);
    let consts: [(&str, u64); 14] = [
        ("OXCCL_MAX_SRCS", MAX_SRCS as u64),
        ("OXCCL_MAX_RANKS", MAX_RANKS as u64),
        ("OXCCL_MAX_BLOCKS", MAX_BLOCKS as u64),
        ("OXCCL_FLAG_BYTES", FLAG_BYTES as u64),
        ("OXCCL_STATUS_OK", STATUS_OK.into()),
        ("OXCCL_STATUS_TIMEOUT", STATUS_TIMEOUT.into()),
        ("OXCCL_STATUS_ABORTED", STATUS_ABORTED.into()),
        ("OXCCL_COLL_ALL_REDUCE_ONE_SHOT", Coll::AllReduceOneShot as u64),
        ("OXCCL_COLL_ALL_REDUCE_TWO_SHOT", Coll::AllReduceTwoShot as u64),
        ("OXCCL_COLL_REDUCE_SCATTER", Coll::ReduceScatter as u64),
        ("OXCCL_COLL_ALL_GATHER", Coll::AllGather as u64),
        ("OXCCL_COLL_BROADCAST", Coll::Broadcast as u64),
        ("OXCCL_COLL_REDUCE", Coll::Reduce as u64),
        ("OXCCL_COLL_ALL_TO_ALL", Coll::AllToAll as u64),
    ];
    rust.extend(consts.iter().map(|&(n, v)| (n, vec![v])));

    assert_eq!(rust.len(), c.len(), "C printed {} lines, Rust has {}: {c:?}", c.len(), rust.len());
    for (name, want) in &rust {
        let got = c.get(*name).unwrap_or_else(|| panic!("C printed nothing for {name}"));
        assert_eq!(got, want, "{name}: C says (offset/size or value) {got:?}, Rust {want:?}");
    }
}
