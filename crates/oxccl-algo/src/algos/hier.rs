//! Hierarchical algorithms: inside each host, then between the ranks of
//! the same local index across hosts (rail-aligned: local rank `i` of
//! every host talks only to local rank `i` of the others), then inside
//! each host again.
//!
//! With `H` hosts of `L` ranks and a collective of `S` bytes, all-reduce
//! is a reduce-scatter of `L` blocks inside each host, an all-reduce of
//! block `i` around the ring of local ranks `i`, and an all-gather inside
//! each host. Each host's network carries `2(H-1)/H · S` out (the lower
//! bound for an all-reduce over `H` hosts) against `2(n-1)/n · S · L`
//! for a flat ring whose every hop crosses hosts (cyclic numbering) and
//! `2(n-1)/n · S` for the ring that follows the hosts, in `2(H-1)` network
//! latencies instead of `2(n-1)`.
//!
//! Reduce-scatter runs the host's reduce-scatter once per host index `j`
//! into scratch (the partial sums of the blocks of local rank `i`'s
//! peers), then a reduce-scatter around the ring of local ranks `i`;
//! all-gather is the reverse. Every phase is a ring of [`super::ring`],
//! pipelined in chunks; phases run one after the other on channel 0.
//!
//! Where the placement is flat (one host, or a host per rank) or uneven
//! (hosts of different sizes) the programs are the ring that follows the
//! hosts, under this algorithm's name.

use super::BuildOptions;
use super::ring::{all_gather_on, all_reduce_on, reduce_scatter_on};
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice};
use crate::placement::Placement;

/// Ranks by host (`hosts[h][i]`) and by local index (`rails[i][h]`).
type Levels = (Vec<Vec<usize>>, Vec<Vec<usize>>);

/// The hosts' rank lists and the rails (local index `i` of every host),
/// when the hierarchy has two levels.
fn levels(at: &Placement) -> Option<Levels> {
    let l = at.per_host()?;
    if at.is_flat() {
        return None;
    }
    let hosts: Vec<Vec<usize>> = (0..at.nhosts()).map(|h| at.ranks_of(h)).collect();
    let rails = (0..l).map(|i| hosts.iter().map(|g| g[i]).collect()).collect();
    Some((hosts, rails))
}

/// Renames a fallback ring program.
fn named(p: &mut Program) {
    p.name.clear();
    p.name.push_str("hier");
}

/// Hierarchical all-reduce.
pub(crate) fn all_reduce(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let Some((hosts, rails)) = levels(at) else {
        super::ring::all_reduce(p, c, o, at);
        return named(p);
    };
    p.reset("hier", c);
    p.in_place = true;
    let (l, h) = (rails.len(), hosts.len());
    let block = |i: usize| part(c.count, l, i);
    let k = o.chunking(block(0).1, c.dtype.size());
    for g in &hosts {
        let (src, dst) = (|q| slice(Slice::input, block(q)), |q| slice(Slice::output, block(q)));
        reduce_scatter_on(p, g, k, &src, &dst);
    }
    for (i, rail) in rails.iter().enumerate() {
        let (boff, blen) = block(i);
        let sub = |j: usize| {
            let (off, len) = part(blen, h, j);
            Slice::output(boff + off, len)
        };
        all_reduce_on(p, rail, o.chunking(part(blen, h, 0).1, c.dtype.size()), &sub, &sub);
    }
    for g in &hosts {
        let own = |q| slice(Slice::output, block(q));
        all_gather_on(p, g, k, &own, &own, false);
    }
}

/// Hierarchical reduce-scatter: block `r` (of `count`) ends at rank `r`.
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let Some((hosts, rails)) = levels(at) else {
        super::ring::reduce_scatter(p, c, o, at);
        return named(p);
    };
    p.reset("hier", c);
    p.in_place = true;
    let (cnt, h) = (c.count, hosts.len());
    let k = o.chunking(cnt, c.dtype.size());
    // Host index j's round: local rank i gathers the host's partial sum of
    // rank rails[i][j]'s block into scratch block j.
    for g in &hosts {
        for &r in g {
            p.need_scratch(r, h * cnt);
        }
        (0..h).for_each(|j| {
            reduce_scatter_on(p, g, k, &|q| Slice::input(rails[q][j] * cnt, cnt), &|_| Slice::scratch(j * cnt, cnt));
        });
    }
    for rail in &rails {
        reduce_scatter_on(p, rail, k, &|j| Slice::scratch(j * cnt, cnt), &|_| Slice::output(0, cnt));
    }
}

/// Hierarchical all-gather: rank `r`'s input ends at `output[r·count..]`.
pub(crate) fn all_gather(p: &mut Program, c: Collective, o: &BuildOptions, at: &Placement) {
    let Some((hosts, rails)) = levels(at) else {
        super::ring::all_gather(p, c, o, at);
        return named(p);
    };
    p.reset("hier", c);
    p.in_place = true;
    let (cnt, h) = (c.count, hosts.len());
    let k = o.chunking(cnt, c.dtype.size());
    for rail in &rails {
        all_gather_on(p, rail, k, &|_| Slice::input(0, cnt), &|j| Slice::output(rail[j] * cnt, cnt), true);
    }
    for g in &hosts {
        (0..h).for_each(|j| {
            let own = |q: usize| Slice::output(rails[q][j] * cnt, cnt);
            all_gather_on(p, g, k, &own, &own, false);
        });
    }
}

fn slice(f: fn(usize, usize) -> Slice, (off, len): (usize, usize)) -> Slice {
    f(off, len)
}
