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

use crate::collective::{Collective, part};
use crate::ir::{Program, Slice, Step};

/// `(p, rem)` for `n` ranks.
fn split(n: usize) -> (usize, usize) {
    let p = 1 << (usize::BITS - 1 - n.leading_zeros());
    (p, n - p)
}

/// The virtual rank of `r`, `None` for a rank folded into its neighbour.
fn virt(r: usize, rem: usize) -> Option<usize> {
    match r {
        r if r >= 2 * rem => Some(r - rem),
        r if r % 2 == 1 => Some(r / 2),
        _ => None,
    }
}

/// Block ranges `[lo, hi)` of virtual ranks.
type Blocks = (usize, usize);

/// The halving schedule of virtual rank `v` among `p`: per round, the
/// partner, the block range kept and the block range sent.
fn halving(v: usize, p: usize) -> Vec<(usize, Blocks, Blocks)> {
    let (mut lo, mut hi) = (0, p);
    let mut rounds = Vec::new();
    let mut d = p / 2;
    while d > 0 {
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if v & d == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
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

/// Rabenseifner all-reduce: the `p` virtual ranks split the count into
/// `p` balanced blocks.
pub(crate) fn all_reduce(p: &mut Program, c: Collective) {
    let (n, count) = (c.nranks, c.count);
    let (p2, rem) = split(n);
    p.reset("rhd", c);
    let at = |b: usize| part(count, p2, b).0;
    let span = |(lo, hi): (usize, usize)| (at(lo), at(hi) - at(lo));
    for r in 0..n {
        if n == 1 {
            push_nonempty(
                p,
                r,
                count,
                Step::Copy {
                    src: Slice::input(0, count),
                    dst: Slice::output(0, count),
                },
            );
            continue;
        }
        let Some(v) = virt(r, rem) else {
            push_nonempty(
                p,
                r,
                count,
                Step::Send {
                    peer: r + 1,
                    src: Slice::input(0, count),
                },
            );
            push_nonempty(
                p,
                r,
                count,
                Step::Recv {
                    peer: r + 1,
                    dst: Slice::output(0, count),
                },
            );
            continue;
        };
        let real = |w: usize| if w < rem { 2 * w + 1 } else { w + rem };
        let mut acc = Slice::input(0, count);
        if r < 2 * rem {
            push_nonempty(
                p,
                r,
                count,
                Step::RecvReduce {
                    peer: r - 1,
                    src: acc,
                    dst: Slice::output(0, count),
                },
            );
            acc = Slice::output(0, count);
        }
        for (partner, keep, give) in halving(v, p2) {
            let (go, gl) = span(give);
            let (ko, kl) = span(keep);
            let peer = real(partner);
            push_nonempty(
                p,
                r,
                gl,
                Step::Send {
                    peer,
                    src: acc.sub(go, gl),
                },
            );
            push_nonempty(
                p,
                r,
                kl,
                Step::RecvReduce {
                    peer,
                    src: acc.sub(ko, kl),
                    dst: Slice::output(ko, kl),
                },
            );
            acc = Slice::output(0, count);
        }
        if acc.buf != crate::ir::Buf::Output {
            // p == 1 cannot happen for n > 1, but keep the output defined.
            push_nonempty(
                p,
                r,
                count,
                Step::Copy {
                    src: acc,
                    dst: Slice::output(0, count),
                },
            );
        }
        let mut d = 1;
        while d < p2 {
            let partner = v ^ d;
            let (mo, ml) = span(((v / d) * d, (v / d) * d + d));
            let (po, pl) = span(((partner / d) * d, (partner / d) * d + d));
            push_nonempty(
                p,
                r,
                ml,
                Step::Send {
                    peer: real(partner),
                    src: Slice::output(mo, ml),
                },
            );
            push_nonempty(
                p,
                r,
                pl,
                Step::Recv {
                    peer: real(partner),
                    dst: Slice::output(po, pl),
                },
            );
            d *= 2;
        }
        if r < 2 * rem {
            push_nonempty(
                p,
                r,
                count,
                Step::Send {
                    peer: r - 1,
                    src: Slice::output(0, count),
                },
            );
        }
    }
}

/// Element offset of virtual rank `v`'s blocks when rank `r` owns block
/// `r` of `c` elements (a virtual rank with two real ranks owns two).
fn vstart(v: usize, rem: usize, c: usize) -> usize {
    if v < rem { 2 * v * c } else { (v + rem) * c }
}

/// Recursive-halving reduce-scatter; partial sums live in scratch (the
/// input is the caller's and stays untouched).
pub(crate) fn reduce_scatter(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    let total = n * cnt;
    let (p2, rem) = split(n);
    p.reset("rhd", c);
    let span = |(lo, hi): (usize, usize)| {
        (
            vstart(lo, rem, cnt),
            vstart(hi, rem, cnt) - vstart(lo, rem, cnt),
        )
    };
    for r in 0..n {
        let own = Slice::output(0, cnt);
        if n == 1 {
            push_nonempty(
                p,
                r,
                cnt,
                Step::Copy {
                    src: Slice::input(0, cnt),
                    dst: own,
                },
            );
            continue;
        }
        let Some(v) = virt(r, rem) else {
            push_nonempty(
                p,
                r,
                total,
                Step::Send {
                    peer: r + 1,
                    src: Slice::input(0, total),
                },
            );
            push_nonempty(
                p,
                r,
                cnt,
                Step::Recv {
                    peer: r + 1,
                    dst: own,
                },
            );
            continue;
        };
        p.need_scratch(r, total);
        let real = |w: usize| if w < rem { 2 * w + 1 } else { w + rem };
        let mut acc = Slice::input(0, total);
        if r < 2 * rem {
            push_nonempty(
                p,
                r,
                total,
                Step::RecvReduce {
                    peer: r - 1,
                    src: acc,
                    dst: Slice::scratch(0, total),
                },
            );
            acc = Slice::scratch(0, total);
        }
        for (partner, keep, give) in halving(v, p2) {
            let (go, gl) = span(give);
            let (ko, kl) = span(keep);
            let peer = real(partner);
            push_nonempty(
                p,
                r,
                gl,
                Step::Send {
                    peer,
                    src: acc.sub(go, gl),
                },
            );
            push_nonempty(
                p,
                r,
                kl,
                Step::RecvReduce {
                    peer,
                    src: acc.sub(ko, kl),
                    dst: Slice::scratch(ko, kl),
                },
            );
            acc = Slice::scratch(0, total);
        }
        if r < 2 * rem {
            push_nonempty(
                p,
                r,
                cnt,
                Step::Send {
                    peer: r - 1,
                    src: acc.sub((r - 1) * cnt, cnt),
                },
            );
        }
        push_nonempty(
            p,
            r,
            cnt,
            Step::Copy {
                src: acc.sub(r * cnt, cnt),
                dst: own,
            },
        );
    }
}

/// Recursive-doubling all-gather.
pub(crate) fn all_gather(p: &mut Program, c: Collective) {
    let (n, cnt) = (c.nranks, c.count);
    let total = n * cnt;
    let (p2, rem) = split(n);
    p.reset("rhd", c);
    let span = |lo: usize, hi: usize| {
        (
            vstart(lo, rem, cnt),
            vstart(hi, rem, cnt) - vstart(lo, rem, cnt),
        )
    };
    for r in 0..n {
        let mine = Slice::output(r * cnt, cnt);
        push_nonempty(
            p,
            r,
            cnt,
            Step::Copy {
                src: Slice::input(0, cnt),
                dst: mine,
            },
        );
        let Some(v) = virt(r, rem) else {
            if n > 1 {
                push_nonempty(
                    p,
                    r,
                    cnt,
                    Step::Send {
                        peer: r + 1,
                        src: Slice::input(0, cnt),
                    },
                );
                push_nonempty(
                    p,
                    r,
                    r * cnt,
                    Step::Recv {
                        peer: r + 1,
                        dst: Slice::output(0, r * cnt),
                    },
                );
                let after = total - (r + 1) * cnt;
                push_nonempty(
                    p,
                    r,
                    after,
                    Step::Recv {
                        peer: r + 1,
                        dst: Slice::output((r + 1) * cnt, after),
                    },
                );
            }
            continue;
        };
        let real = |w: usize| if w < rem { 2 * w + 1 } else { w + rem };
        if r < 2 * rem {
            push_nonempty(
                p,
                r,
                cnt,
                Step::Recv {
                    peer: r - 1,
                    dst: Slice::output((r - 1) * cnt, cnt),
                },
            );
        }
        let mut d = 1;
        while d < p2 {
            let partner = v ^ d;
            let (mo, ml) = span((v / d) * d, (v / d) * d + d);
            let (po, pl) = span((partner / d) * d, (partner / d) * d + d);
            push_nonempty(
                p,
                r,
                ml,
                Step::Send {
                    peer: real(partner),
                    src: Slice::output(mo, ml),
                },
            );
            push_nonempty(
                p,
                r,
                pl,
                Step::Recv {
                    peer: real(partner),
                    dst: Slice::output(po, pl),
                },
            );
            d *= 2;
        }
        if r < 2 * rem {
            let before = (r - 1) * cnt;
            push_nonempty(
                p,
                r,
                before,
                Step::Send {
                    peer: r - 1,
                    src: Slice::output(0, before),
                },
            );
            let after = total - r * cnt;
            push_nonempty(
                p,
                r,
                after,
                Step::Send {
                    peer: r - 1,
                    src: Slice::output(r * cnt, after),
                },
            );
        }
    }
}
