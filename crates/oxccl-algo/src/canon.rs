//! The canonical reduction order: the one order in which oxccl's
//! deterministic mode (`OXCCL_DETERMINISTIC=1`) reduces every element,
//! whatever the size, algorithm, chunking, transport or placement.
//!
//! For ranks `l..r` the canonical value is
//!
//! ```text
//! canon(l, r) = x_l                               when r - l = 1
//!             = canon(l, m) ⊕ canon(m, r)         otherwise,
//!               m = l + 2^(⌈log2(r - l)⌉ - 1)
//! ```
//!
//! the balanced binary tree over the ranks in rank order whose left
//! subtrees are powers of two: 3 ranks give `(x0 ⊕ x1) ⊕ x2`, 6 ranks
//! `((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ (x4 ⊕ x5)`. Each `⊕` is one application of
//! the pairwise host kernel for the type and operator, rounded to the
//! type (f16, bf16 and FP8 round at every node). `a ⊕ b` and `b ⊕ a` give
//! the same bits, so only the tree matters, not which operand comes first.
//!
//! [`siblings`] is what the verifier asks at every reduction: whether the
//! two operands are the two halves of one node of the tree. A program all
//! of whose reductions answer yes leaves `canon(0, n)` in every output
//! element (each value is then the canonical value of its ranks, by
//! induction over the reductions).
//!
//! ```
//! use oxccl_algo::canon;
//! assert_eq!(canon::expr(6), "((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ (x4 ⊕ x5)");
//! assert_eq!(canon::split(0, 3), 2);
//! assert!(canon::siblings(3, 0..2, 2..3) && !canon::siblings(3, 1..2, 2..3));
//! ```

use std::ops::Range;

/// Where the canonical tree splits ranks `l..r` (`r - l ≥ 2`): `l` plus
/// the largest power of two below `r - l`.
pub fn split(l: usize, r: usize) -> usize {
    debug_assert!(r >= l + 2, "split of {l}..{r}");
    l + (r - l).next_power_of_two() / 2
}

/// Whether `l..r` is a node of the canonical tree over `0..n`.
pub fn is_node(n: usize, l: usize, r: usize) -> bool {
    let (mut lo, mut hi) = (0, n);
    if l >= r || r > n {
        return false;
    }
    loop {
        if (lo, hi) == (l, r) {
            return true;
        }
        if hi - lo < 2 {
            return false;
        }
        let m = split(lo, hi);
        if r <= m {
            hi = m;
        } else if l >= m {
            lo = m;
        } else {
            return false;
        }
    }
}

/// Whether reducing the values of ranks `a` and `b` (in either order) is
/// a node of the canonical tree over `0..n`: they are its two halves.
pub fn siblings(n: usize, a: Range<usize>, b: Range<usize>) -> bool {
    let (x, y) = if a.start <= b.start { (a, b) } else { (b, a) };
    x.end == y.start
        && x.start < x.end
        && y.start < y.end
        && is_node(n, x.start, y.end)
        && split(x.start, y.end) == x.end
}

/// The canonical tree over `0..n` written out (`x0` … are the ranks'
/// contributions): what the README shows, and what error messages print.
pub fn expr(n: usize) -> String {
    fn go(l: usize, r: usize, top: bool, out: &mut String) {
        if r - l == 1 {
            out.push_str(&format!("x{l}"));
            return;
        }
        let m = split(l, r);
        if !top {
            out.push('(');
        }
        go(l, m, false, out);
        out.push_str(" ⊕ ");
        go(m, r, false, out);
        if !top {
            out.push(')');
        }
    }
    let mut s = String::new();
    if n > 0 {
        go(0, n, true, &mut s);
    }
    s
}

/// Folds `leaf(0) … leaf(n-1)` in the canonical order with `op` (which
/// takes the left and the right subtree's values).
pub fn fold<T>(n: usize, leaf: &mut impl FnMut(usize) -> T, op: &mut impl FnMut(T, T) -> T) -> Option<T> {
    fn go<T>(l: usize, r: usize, leaf: &mut impl FnMut(usize) -> T, op: &mut impl FnMut(T, T) -> T) -> T {
        if r - l == 1 {
            return leaf(l);
        }
        let m = split(l, r);
        let a = go(l, m, leaf, op);
        let b = go(m, r, leaf, op);
        op(a, b)
    }
    (n > 0).then(|| go(0, n, leaf, op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_of_the_issue() {
        assert_eq!(expr(1), "x0");
        assert_eq!(expr(2), "x0 ⊕ x1");
        assert_eq!(expr(3), "(x0 ⊕ x1) ⊕ x2");
        assert_eq!(expr(5), "((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ x4");
        assert_eq!(expr(6), "((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ (x4 ⊕ x5)");
        assert_eq!(expr(7), "((x0 ⊕ x1) ⊕ (x2 ⊕ x3)) ⊕ ((x4 ⊕ x5) ⊕ x6)");
        let f = fold(6, &mut |i| i.to_string(), &mut |a, b| format!("({a}+{b})")).unwrap();
        assert_eq!(f, "(((0+1)+(2+3))+(4+5))");
    }

    #[test]
    fn every_node_and_only_nodes_are_siblings() {
        for n in 1..40 {
            // Collect the tree's internal nodes by walking it.
            let mut nodes = Vec::new();
            let mut stack = vec![(0, n)];
            while let Some((l, r)) = stack.pop() {
                if r - l >= 2 {
                    let m = split(l, r);
                    nodes.push((l, m, r));
                    stack.push((l, m));
                    stack.push((m, r));
                }
            }
            assert_eq!(nodes.len(), n - 1);
            for a in 0..n {
                for b in a + 1..n {
                    for c in b + 1..=n {
                        let want = nodes.contains(&(a, b, c));
                        assert_eq!(siblings(n, a..b, b..c), want, "n {n}: {a}..{b} ⊕ {b}..{c}");
                        assert_eq!(siblings(n, b..c, a..b), want, "commuted");
                    }
                }
            }
        }
    }
}
