//! A reference interpreter: runs a program on real data, all ranks in one
//! thread, with oxccl-core's host kernels.
//!
//! The verifier proves which contributions every element holds; this runs
//! the arithmetic, so a researcher (and the test suite) can see the bits a
//! program produces: rounding of half-precision types, and whether every
//! rank of an all-reduce ends with the same bits (it does only if every
//! rank reduces in the same order). It is deliberately simple (queues
//! without bounds, ranks stepped round-robin); run the verifier first: a
//! race-free program gives the same result in any schedule, and this is one.

use crate::ir::{Buf, Program, Slice, Step};
use oxccl_core::{Error, ReduceOp, Result, kernels};
use std::collections::{HashMap, VecDeque};

/// Bytes a step writes: (owner rank, slice, data).
type Write = Option<(usize, Slice, Vec<u8>)>;
/// Bytes a step sends: (receiver, data).
type Out = Option<(usize, Vec<u8>)>;

/// Runs `program` with `inputs[r]` as rank `r`'s input bytes and `ops[r]`
/// as its reduction operator (one entry for all ranks is enough); returns
/// every rank's output bytes. `avg` divides by the rank count at the end,
/// `premulsum` scales each rank's input by its own scalar first.
pub fn run(program: &Program, ops: &[ReduceOp], inputs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
    let c = program.collective;
    let (n, dtype, es) = (c.nranks, c.dtype, c.dtype.size());
    if inputs.len() != n || program.ranks.len() != n {
        return Err(Error::invalid(format!(
            "{}: {} inputs and {} rank programs for {n} ranks",
            program.name,
            inputs.len(),
            program.ranks.len()
        )));
    }
    if ops.len() != 1 && ops.len() != n {
        return Err(Error::invalid(format!("{} reduce ops for {n} ranks; give one, or one per rank", ops.len())));
    }
    let op_of = |r: usize| ops[if ops.len() == 1 { 0 } else { r }];
    let mut bufs: Vec<[Vec<u8>; 3]> = Vec::with_capacity(n);
    for (r, input) in inputs.iter().enumerate() {
        if input.len() != c.input_len(r) * es {
            return Err(Error::invalid(format!(
                "rank {r}: input of {} bytes, {} needs {} elements of {dtype}",
                input.len(),
                c,
                c.input_len(r)
            )));
        }
        op_of(r).check(dtype)?;
        let mut input = input.clone();
        if let (true, ReduceOp::PreMulSum { scalar }) = (c.kind.reduces(), op_of(r)) {
            kernels::premul_in_place(dtype, &mut input, scalar)?;
        }
        bufs.push([input, vec![0; c.output_len(r) * es], vec![0; program.ranks[r].scratch * es]]);
    }
    let kop = match op_of(0) {
        ReduceOp::Avg | ReduceOp::PreMulSum { .. } => ReduceOp::Sum,
        op => op,
    };
    let range = |s: &Slice| s.off * es..s.end() * es;
    let slot = |b: Buf| b as usize;
    let procs: Vec<(usize, usize)> =
        program.ranks.iter().enumerate().flat_map(|(r, rp)| (0..rp.channels.len()).map(move |ch| (r, ch))).collect();
    let mut pc = vec![0usize; procs.len()];
    let mut msgs: HashMap<(usize, usize, usize), VecDeque<Vec<u8>>> = HashMap::new();
    let mut sigs: HashMap<(usize, usize, usize), usize> = HashMap::new();
    loop {
        let mut progress = false;
        let mut done = true;
        for (pi, &(r, ch)) in procs.iter().enumerate() {
            let steps = &program.ranks[r].channels[ch];
            while let Some(step) = steps.get(pc[pi]) {
                let incoming = match step.recv_peer() {
                    Some(from) => match msgs.get_mut(&(from, r, ch)).and_then(VecDeque::pop_front) {
                        Some(m) => m,
                        None => break,
                    },
                    None => Vec::new(),
                };
                if let Step::Wait { peer } = step {
                    match sigs.get_mut(&(*peer, r, ch)) {
                        Some(k) if *k > 0 => *k -= 1,
                        _ => break,
                    }
                }
                let read = |bufs: &[[Vec<u8>; 3]], who: usize, s: &Slice| bufs[who][slot(s.buf)][range(s)].to_vec();
                let reduce = |a: &[u8], b: &[u8]| -> Result<Vec<u8>> {
                    let mut out = vec![0u8; a.len()];
                    kernels::reduce2(dtype, kop, &mut out, a, b)?;
                    Ok(out)
                };
                let (write, send): (Write, Out) = match step {
                    Step::Send { peer, src } => (None, Some((*peer, read(&bufs, r, src)))),
                    Step::Recv { dst, .. } => (Some((r, *dst, incoming)), None),
                    Step::RecvReduce { src, dst, .. } => {
                        (Some((r, *dst, reduce(&read(&bufs, r, src), &incoming)?)), None)
                    }
                    Step::RecvReduceSend { send, src, .. } => {
                        (None, Some((*send, reduce(&read(&bufs, r, src), &incoming)?)))
                    }
                    Step::RecvCopySend { send, dst, .. } => {
                        (Some((r, *dst, incoming.clone())), Some((*send, incoming)))
                    }
                    Step::RecvReduceCopySend { send, src, dst, .. } => {
                        let v = reduce(&read(&bufs, r, src), &incoming)?;
                        (Some((r, *dst, v.clone())), Some((*send, v)))
                    }
                    Step::Copy { src, dst } => (Some((r, *dst, read(&bufs, r, src))), None),
                    Step::Reduce { srcs, dst } => {
                        let mut acc = read(&bufs, r, &srcs[0]);
                        for s in &srcs[1..] {
                            acc = reduce(&acc, &read(&bufs, r, s))?;
                        }
                        (Some((r, *dst, acc)), None)
                    }
                    Step::Put { peer, src, dst } => (Some((*peer, *dst, read(&bufs, r, src))), None),
                    Step::Get { peer, src, dst } => (Some((r, *dst, read(&bufs, *peer, src))), None),
                    Step::GetReduce { peer, src, acc, dst } => {
                        (Some((r, *dst, reduce(&read(&bufs, r, acc), &read(&bufs, *peer, src))?)), None)
                    }
                    Step::Signal { peer } => {
                        *sigs.entry((r, *peer, ch)).or_default() += 1;
                        (None, None)
                    }
                    Step::Wait { .. } => (None, None),
                };
                if let Some((who, dst, data)) = write {
                    bufs[who][slot(dst.buf)][range(&dst)].copy_from_slice(&data);
                }
                if let Some((to, data)) = send {
                    msgs.entry((r, to, ch)).or_default().push_back(data);
                }
                pc[pi] += 1;
                progress = true;
            }
            done &= pc[pi] == steps.len();
        }
        if done {
            break;
        }
        if !progress {
            return Err(Error::program(format!("{}: no rank can make progress; run the verifier on it", program.name)));
        }
    }
    let mut outputs: Vec<Vec<u8>> = bufs.into_iter().map(|[_, out, _]| out).collect();
    if c.kind.reduces() && matches!(op_of(0), ReduceOp::Avg) {
        for out in &mut outputs {
            kernels::finish_avg(dtype, out, n)?;
        }
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algos::{Algorithm, BuildOptions, build};
    use crate::collective::{CollKind, Collective};

    fn floats(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn ring_all_reduce_sums_and_averages() {
        let c = Collective::new(CollKind::AllReduce, 3, 4);
        let p = build(Algorithm::Ring, &c, &BuildOptions::default()).unwrap();
        let inputs: Vec<Vec<u8>> = (0..3).map(|r| floats(&[r as f32, 1.0, 2.0, 10.0 * r as f32])).collect();
        let out = run(&p, &[ReduceOp::Sum], &inputs).unwrap();
        assert!(out.iter().all(|o| *o == floats(&[3.0, 3.0, 6.0, 30.0])));
        let out = run(&p, &[ReduceOp::Avg], &inputs).unwrap();
        assert_eq!(out[2], floats(&[1.0, 1.0, 2.0, 10.0]));
        let ops: Vec<ReduceOp> = (0..3).map(|r| ReduceOp::PreMulSum { scalar: r as f64 }).collect();
        let out = run(&p, &ops, &inputs).unwrap();
        assert_eq!(out[0], floats(&[5.0, 3.0, 6.0, 50.0]));
        assert!(run(&p, &[ReduceOp::Sum], &inputs[..2]).unwrap_err().to_string().contains("2 inputs"));
    }
}
