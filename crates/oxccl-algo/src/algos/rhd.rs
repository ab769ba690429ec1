//! Recursive halving and doubling, for any number of ranks.
//!
//! With `p` the largest power of two not above `n` and `rem = n - p`, the
//! first `2·rem` ranks pair up: each even one hands its data to its odd
//! neighbour before the exchange and gets the result back after it, so
//! `p` ranks ("virtual ranks") run the power-of-two algorithm.
//! Reduce-scatter by recursive halving exchanges half, a quarter, … of the
//! data with partners at distance `p/2, p/4, …, 1`; all-gather by recursive
//! doubling runs the distances the other way; all-reduce is one then the
//! other (Rabenseifner). For `n` a power of two each rank sends exactly
//! what the ring sends (`2(n-1)/n · S` for all-reduce) in `2·log2 n`
//! messages instead of `2(n-1)`.

use super::copy_nonempty;
use crate::collective::{Collective, part};
use crate::ir::{Buf, Program, Slice, Step};

/// A range `[lo, hi)` of virtual ranks' blocks.
type Blocks = (usize, usize);

/// The virtual ranks of `n` real ones.
struct Virtual {
    /// Largest power of two not above `n`.
    p: usize,
    /// Ranks folded into a neighbour.
    rem: usize,
}

impl Virtual {
    fn new(n: usize) -> Virtual {
        let p = 1 << (usize::BITS - 1 - n.leading_zeros());
        Virtual { p, rem: n - p }
    }

    /// The virtual rank of real rank `r`, `None` for a rank folded into
    /// its odd neighbour.
    fn of(&self, r: usize) -> Option<usize> {
        match r {
            r if r >= 2 * self.rem => Some(r - self.rem),
            r if r % 2 == 1 => Some(r / 2),
            _ => None,
        }
    }

    /// The real rank that runs virtual rank `v`.
    fn real(&self, v: usize) -> usize {
        if v < self.rem { 2 * v + 1 } else { v + self.rem }
    }

    /// Whether real rank `r` stands for a folded neighbour too.
    fn doubled(&self, r: usize) -> bool {
        r < 2 * self.rem
    }
}

/// The halving schedule of virtual rank `v` among `p`: per round, the
/// partner, the blocks kept and the blocks given away.
fn halving(v: usize, p: usize) -> Vec<(usize, Blocks, Blocks)> {
    let (mut lo, mut hi) = (0, p);
    let mut rounds = Vec::new();
    let mut d = p / 2;
    while d > 0 {
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if v & d == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        rounds.push((v ^ d, keep, give));
        (lo, hi) = keep;
        d /= 2;
    }
    rounds
}

fn push_nonempty(p: &mut Program, r: usize, len: usize, step: Step) {
    if len > 0 {
        p.push(r, 0, step);
    }
}

/// Recursive halving for real rank `r` (virtual `v`): partial sums start in
/// `acc` and land in buffer `dst` at the same offsets; `span` turns blocks
/// into an element range `(offset, len)`. Returns where the sums are.
fn halve(
    p: &mut Program,
    r: usize,
    v: usize,
    vr: &Virtual,
    span: &dyn Fn(Blocks) -> (usize, usize),
    mut acc: Slice,
    dst: Buf,
) -> Slice {
    for (partner, keep, give) in halving(v, vr.p) {
        let ((go, gl), (ko, kl)) = (span(give), span(keep));
        let peer = vr.real(partner);
        push_nonempty(p, r, gl, Step::Send { peer, src: acc.sub(go, gl) });
        push_nonempty(
            p,
            r,
            kl,
            Step::RecvReduce { peer, src: acc.sub(ko, kl), dst: Slice::new(dst, acc.off + ko, kl) },
        );
        acc = Slice::new(dst, acc.off, acc.len);
    }
    acc
}

/// Recursive doubling for real rank `r` (virtual `v`): exchanges ever
/// larger finished ranges of the output with partners at distance 1, 2, ….
fn double(p: &mut Program, r: usize, v: usize, vr: &Virtual, span: &dyn Fn(Blocks) -> (usize, usize)) {
    let mut d = 1;
    while d < vr.p {
        let partner = v ^ d;
        let own = |w: usize| ((w / d) * d, (w / d) * d + d);
        let ((mo, ml), (po, pl)) = (span(own(v)), span(own(partner)));
        let peer = vr.real(partner);
        push_nonempty(p, r, ml, Step::Send { peer, src: Slice::output(mo, ml) });
        push_nonempty(p, r, pl, Step::Recv { peer, dst: Slice::output(po, pl) });
        d *= 2;
    }
}

/// The all-reduce steps of rank `r` that lie outside the power-of-two
/// core: a lone rank copies, a folded rank hands its input to its odd
/// neighbour and gets the result back. `None` then, else `r`'s virtual rank.
fn whole_buffer_edge(p: &mut Program, r: usize, vr: &Virtual, input: Slice, output: Slice) -> Option<usize> {
    if vr.p == 1 {
        copy_nonempty(p, r, input, output);
        return None;
    }
    let v = vr.of(r);
    if v.is_none() {
        push_nonempty(p, r, input.len, Step::Send { peer: r + 1, src: input });
        push_nonempty(p, r, output.len, Step::Recv { peer: r + 1, dst: output });
    }
    v
}

/// Rabenseifner all-reduce: the `p` virtual ranks split the count into
/// `p` balanced blocks.
pub(crate) fn all_reduce(p: &mut Program, c: Collective) {
    let (n, count) = (c.nranks, c.count);
    let vr = Virtual::new(n);
    p.reset("rhd", c);
    p.in_place = true;
    let at = |b: usize| part(count, vr.p, b).0;
    let span = |(lo, hi): Blocks| (at(lo), at(hi) - at(lo));
    let (input, output) = (Slice::input(0, count), Slice::output(0, count));
    for r in 0..n {
        let Some(v) = whole_buffer_edge(p, r, &vr, input, output) else { continue };
        let mut acc = input;
        if vr.doubled(r) {
            push_nonempty(p, r, count, Step::RecvReduce { peer: r - 1, src: acc, dst: output });
            acc = output;
        }
        halve(p, r, v, &vr, &span, acc, Buf::Output);
        double(p, r, v, &vr, &span);
        if vr.doubled(r) {
            push_nonempty(p, r, count, Step::Send { peer: r - 1, src: output });
        }
    }
}

/// Recursive-doubling all-reduce: in round `k` every virtual rank
/// exchanges its whole partial result with the partner at distance `2^k`
/// and reduces, so after `log2 p` rounds every rank holds the total.
/// `log2 p` messages of the whole buffer (Rabenseifner sends `2·log2 p`
/// smaller ones): the fewest latencies, for small buffers. Both partners
/// reduce the same two operands, so every rank ends with the same bits.
///
/// A round reduces into a buffer other than the one it sends (output and
/// scratch take turns, the last round lands in the output), so a message
/// bigger than a connection's FIFO can drain while the partner's arrives
/// without the executor copying what is left of it.
pub(crate) fn all_reduce_doubling(p: &mut Program, c: Collective) {
    let (n, count) = (c.nranks, c.count);
    let vr = Virtual::new(n);
    p.reset("doubling", c);
    p.in_place = true;
    let (input, output) = (Slice::input(0, count), Slice::output(0, count));
    let rounds = vr.p.trailing_zeros() as usize;
    for r in 0..n {
        let Some(v) = whole_buffer_edge(p, r, &vr, input, output) else { continue };
        // Reductions left, the fold's included: the k-th from the end
        // writes the output when k is odd (the last one), else scratch.
        let mut left = rounds + usize::from(vr.doubled(r));
        if left > 1 && count > 0 {
            p.need_scratch(r, count);
        }
        let mut dst = || {
            let d = if left % 2 == 1 { output } else { Slice::scratch(0, count) };
            left -= 1;
            d
        };
        let mut acc = input;
        if vr.doubled(r) {
            let d = dst();
            push_nonempty(p, r, count, Step::RecvReduce { peer: r - 1, src: acc, dst: d });
            acc = d;
        }
        let mut d = 1;
        while d < vr.p {
            let peer = vr.real(v ^ d);
            let to = dst();
            push_nonempty(p, r, count, Step::Send { peer, src: acc });
            push_nonempty(p, r, count, Step::RecvReduce { peer, src: acc, dst: to });
            acc = to;
            d *= 2;
        }
        if vr.doubled(r) {
            push_nonempty(p, r, count, Step::Send { peer: r - 1, src: output });
        }
    }
}

/// Element offset of virtual rank `v`'s blocks when rank `r` owns block
/// `r` of `c` elements (a virtual rank with two real ranks owns two).
fn vstart(v: usize, vr: &Virtual, c: usize) -> usize {
    if v < vr.rem { 2 * v * c } else { (v + vr.rem) * c }
}

/// The elements `(offset, len)` of virtual blocks `[lo, hi)` when every
/// real rank owns `c` elements.
fn vspan((lo, hi): Blocks, vr: &Virtual, c: usize) -> (usize, usize) {
    (vstart(lo, vr, c), vstart(hi, vr, c) - vstart(lo, vr, c))
}

/// Recursive-halving reduce-scatter; partial sums live in scratch (the
/// input is the caller's and stays untouched).
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    let total = n * cnt;
    let vr = Virtual::new(n);
    p.reset("rhd", c);
    p.in_place = true;
    let span = |b: Blocks| vspan(b, &vr, cnt);
    let own = Slice::output(0, cnt);
    for r in 0..n {
        if n == 1 {
            copy_nonempty(p, r, Slice::input(0, cnt), own);
            continue;
        }
        let Some(v) = vr.of(r) else {
            push_nonempty(p, r, total, Step::Send { peer: r + 1, src: Slice::input(0, total) });
            push_nonempty(p, r, cnt, Step::Recv { peer: r + 1, dst: own });
            continue;
        };
        p.need_scratch(r, total);
        let mut acc = Slice::input(0, total);
        if vr.doubled(r) {
            push_nonempty(p, r, total, Step::RecvReduce { peer: r - 1, src: acc, dst: Slice::scratch(0, total) });
            acc = Slice::scratch(0, total);
        }
        let acc = halve(p, r, v, &vr, &span, acc, Buf::Scratch);
        if vr.doubled(r) {
            push_nonempty(p, r, cnt, Step::Send { peer: r - 1, src: acc.sub((r - 1) * cnt, cnt) });
        }
        copy_nonempty(p, r, acc.sub(r * cnt, cnt), own);
    }
}

/// Recursive-doubling all-gather.
pub(crate) fn all_gather(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    let total = n * cnt;
    let vr = Virtual::new(n);
    p.reset("rhd", c);
    p.in_place = true;
    let span = |b: Blocks| vspan(b, &vr, cnt);
    for r in 0..n {
        copy_nonempty(p, r, Slice::input(0, cnt), Slice::output(r * cnt, cnt));
        let Some(v) = vr.of(r) else {
            if n > 1 {
                push_nonempty(p, r, cnt, Step::Send { peer: r + 1, src: Slice::input(0, cnt) });
                push_nonempty(p, r, r * cnt, Step::Recv { peer: r + 1, dst: Slice::output(0, r * cnt) });
                let after = total - (r + 1) * cnt;
                push_nonempty(p, r, after, Step::Recv { peer: r + 1, dst: Slice::output((r + 1) * cnt, after) });
            }
            continue;
        };
        if vr.doubled(r) {
            push_nonempty(p, r, cnt, Step::Recv { peer: r - 1, dst: Slice::output((r - 1) * cnt, cnt) });
        }
        double(p, r, v, &vr, &span);
        if vr.doubled(r) {
            let before = (r - 1) * cnt;
            push_nonempty(p, r, before, Step::Send { peer: r - 1, src: Slice::output(0, before) });
            let after = total - r * cnt;
            push_nonempty(p, r, after, Step::Send { peer: r - 1, src: Slice::output(r * cnt, after) });
        }
    }
}
