//! Byte sizes as people write them: `4194304`, `4M`, `512K`, `1.5G`,
//! `64MB` (binary units, as nccl-tests' `parsesize`), one parser for the
//! benchmarks' flags and every size variable.

/// Bytes `v` stands for: a number with an optional K, M or G (×1024ⁿ),
/// optionally followed by `B`; `None` if it is not one (or is negative,
/// or beyond 2⁴⁸).
pub fn parse_size(v: &str) -> Option<usize> {
    let t = v.trim();
    let t = t.strip_suffix(['B', 'b']).filter(|r| r.ends_with(|c: char| c.is_ascii_alphabetic())).unwrap_or(t);
    let (num, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (t[..i].trim_end(), c.to_ascii_uppercase()),
        _ => (t, ' '),
    };
    let mult: f64 = match unit {
        ' ' => 1.0,
        'K' => 1024.0,
        'M' => 1024.0 * 1024.0,
        'G' => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let x: f64 = num.parse().ok()?;
    let bytes = x * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > (1u64 << 48) as f64 {
        return None;
    }
    Some(bytes as usize)
}

/// What [`parse_size`] accepts, for error messages.
pub const SIZE_FORMS: &str = "a number of bytes with an optional K, M or G suffix (4194304, 4M, 512K)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("64MB"), Some(64 << 20));
        assert_eq!(parse_size("1.5m"), Some(3 << 19));
        assert_eq!(parse_size(" 2g "), Some(2 << 30));
        for bad in ["", "x", "4X", "-1", "1e300", "M"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }
}
