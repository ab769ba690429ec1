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
//! pipelined in chunks. The data is cut in [`CHANNELS`] parts, each on a
//! channel of its own, so that one part's phase inside the hosts overlaps
//! another's across them (one channel for less than two pipeline chunks
//! per rank); within a channel the phases run one after the other.
//!
//! All-to-all is aggregated per host and rail: local rank `i` first hands
//! local rank `j` of its host everything it has for the ranks of local
//! index `j` on every host; then each rank sends each other host's rank of
//! its own local index one message holding its host's `L` blocks for it:
//! `H-1` messages across hosts per rank (pairwise all-to-all: `n-1`,
//! `(H-1)·L` of them crossing), each `L` times bigger.
//!
//! Where the placement is flat (one host, or a host per rank) or uneven
//! (hosts of different sizes) the programs are the ring that follows the
//! hosts, under this algorithm's name.

use super::BuildOptions;
use super::ring::{On, all_gather_on, all_reduce_on, reduce_scatter_on};
use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};
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

/// Channels of the hierarchical programs.
pub const CHANNELS: usize = 2;

/// How many channels `bytes` of data per rank get.
fn channels(bytes: usize, o: &BuildOptions) -> usize {
    if bytes >= 2 * o.chunk_bytes { CHANNELS } else { 1 }
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
    let nch = channels(c.size_bytes(), o);
    for ch in 0..nch {
        let (coff, clen) = part(c.count, nch, ch);
        let block = |i: usize| {
            let (off, len) = part(clen, l, i);
            (coff + off, len)
        };
        let k = o.chunking(block(0).1, c.dtype.size());
        for g in &hosts {
            let (src, dst) = (|q| slice(Slice::input, block(q)), |q| slice(Slice::output, block(q)));
            reduce_scatter_on(p, On { ring: g, ch }, k, &src, &dst);
        }
        for (i, rail) in rails.iter().enumerate() {
            let (boff, blen) = block(i);
            let sub = |j: usize| {
                let (off, len) = part(blen, h, j);
                Slice::output(boff + off, len)
            };
            all_reduce_on(p, On { ring: rail, ch }, o.chunking(part(blen, h, 0).1, c.dtype.size()), &sub, &sub);
        }
        for g in &hosts {
            let own = |q| slice(Slice::output, block(q));
            all_gather_on(p, On { ring: g, ch }, k, &own, &own, false);
        }
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
    for g in &hosts {
        for &r in g {
            p.need_scratch(r, h * cnt);
        }
    }
    let nch = channels(c.size_bytes(), o);
    for ch in 0..nch {
        let (off, len) = part(cnt, nch, ch);
        let k = o.chunking(len, c.dtype.size());
        // Host index j's round: local rank i gathers the host's partial sum
        // of rank rails[i][j]'s block into scratch block j.
        for g in &hosts {
            (0..h).for_each(|j| {
                let src = |q: usize| Slice::input(rails[q][j] * cnt + off, len);
                reduce_scatter_on(p, On { ring: g, ch }, k, &src, &|_| Slice::scratch(j * cnt + off, len));
            });
        }
        for rail in &rails {
            let src = |j: usize| Slice::scratch(j * cnt + off, len);
            reduce_scatter_on(p, On { ring: rail, ch }, k, &src, &|_| Slice::output(off, len));
        }
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
    let nch = channels(c.size_bytes(), o);
    for ch in 0..nch {
        let (off, len) = part(cnt, nch, ch);
        let k = o.chunking(len, c.dtype.size());
        for rail in &rails {
            let dst = |j: usize| Slice::output(rail[j] * cnt + off, len);
            all_gather_on(p, On { ring: rail, ch }, k, &|_| Slice::input(off, len), &dst, true);
        }
        for g in &hosts {
            (0..h).for_each(|j| {
                let own = |q: usize| Slice::output(rails[q][j] * cnt + off, len);
                all_gather_on(p, On { ring: g, ch }, k, &own, &own, false);
            });
        }
    }
}

/// Hierarchical all-to-all (see the module docs). Scratch: `2n` blocks;
/// the first `n` hold, at `[h'·L + i]`, local rank `i`'s block for the
/// rank of this local index on host `h'`; the second `n` land, at
/// `[h·L + i]`, host `h`'s blocks for this rank.
pub(crate) fn all_to_all(p: &mut Program, c: Collective, at: &Placement) {
    let Some((hosts, rails)) = levels(at) else {
        super::rooted::pairwise_all_to_all(p, c);
        return named(p);
    };
    p.reset("hier", c);
    p.in_place = true;
    let (cnt, n, h, l) = (c.count, c.nranks, hosts.len(), rails.len());
    if cnt == 0 {
        return;
    }
    let gathered = |hh: usize, i: usize| Slice::scratch((hh * l + i) * cnt, cnt);
    let landed = |hh: usize, i: usize| Slice::scratch((n + hh * l + i) * cnt, cnt);
    for (hh, g) in hosts.iter().enumerate() {
        for (i, &r) in g.iter().enumerate() {
            p.need_scratch(r, 2 * n * cnt);
            let input = |d: usize| Slice::input(d * cnt, cnt);
            for (x, rail) in rails[i].iter().enumerate() {
                p.push(r, 0, Step::Copy { src: input(*rail), dst: gathered(x, i) });
            }
            for t in 1..l {
                let (j, from) = ((i + t) % l, (i + l - t) % l);
                for (x, &d) in rails[j].iter().enumerate() {
                    p.push(r, 0, Step::Send { peer: g[j], src: input(d) });
                    p.push(r, 0, Step::Recv { peer: g[from], dst: gathered(x, from) });
                }
            }
            for (k, &src) in g.iter().enumerate() {
                p.push(r, 0, Step::Copy { src: gathered(hh, k), dst: Slice::output(src * cnt, cnt) });
            }
            for t in 1..h {
                let (to, from) = ((hh + t) % h, (hh + h - t) % h);
                p.push(r, 0, Step::Send { peer: rails[i][to], src: Slice::scratch(to * l * cnt, l * cnt) });
                p.push(r, 0, Step::Recv { peer: rails[i][from], dst: Slice::scratch((n + from * l) * cnt, l * cnt) });
                for (k, &src) in hosts[from].iter().enumerate() {
                    p.push(r, 0, Step::Copy { src: landed(from, k), dst: Slice::output(src * cnt, cnt) });
                }
            }
        }
    }
}

fn slice(f: fn(usize, usize) -> Slice, (off, len): (usize, usize)) -> Slice {
    f(off, len)
}
