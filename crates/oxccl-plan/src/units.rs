//! Numbers as people write them on a command line, and bytes as the
//! planner prints them.
//!
//! Counts ([`parse_count`]): `64`, `7.5e9`, `70e9`, `1_000`, `7.5B`
//! (billion), `175M`, `1T`, `10K`. Byte sizes ([`parse_bytes`]): a number
//! with an optional unit, decimal (`B`, `KB`, `MB`, `GB`, `TB`, `PB`:
//! powers of 10³) or binary (`KiB`, `MiB`, `GiB`, `TiB`, `PiB`: powers
//! of 2¹⁰). This is the one convention of oxccl's tools: `oxccl-sim`
//! reads its sizes through [`parse_bytes`] too (only its nccl-tests-style
//! bare `8G` stays 2³⁰), and bandwidths follow it
//! (`oxccl_algo::cost::parse_bandwidth`: `25GB/s` = 25·10⁹ bytes per
//! second, `25GiB/s` = 25·2³⁰). The planner does not reuse `oxccl_core::size::parse_size`:
//! that one follows nccl-tests for `oxccl-perf` and the environment
//! variables, where `G` and `GB` mean 2³⁰, while a GPU sold as "80GB" and
//! the ZeRO paper's "120 GB" are 10⁹-byte gigabytes. A bare
//! `K`/`M`/`G`/`T` suffix on a byte size is refused here as ambiguous.
//! Printed sizes name their unit: `GB` for 10⁹, `GiB` for 2³⁰
//! ([`format_gb_gib`] prints both).

/// A count written `N`, `N.NeE`, or with a `K`, `M`, `B` (or `G`) or `T`
/// suffix for thousand, million, billion, trillion; it must be a whole
/// number of at least 1. The error names what was wrong with `s`.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let not_a_number = || format!("{s:?} is not a number (write 64, 7.5e9, 7.5B or 70B)");
    let (num, suffix) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() && t[..i].parse::<f64>().is_ok() => (&t[..i], Some(c)),
        _ => (t.as_str(), None),
    };
    let x: f64 = num.parse().map_err(|_| not_a_number())?;
    let mult = match suffix.map(|c| c.to_ascii_uppercase()) {
        None => 1.0,
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('B' | 'G') => 1e9,
        Some('T') => 1e12,
        Some(c) => return Err(format!("{s:?} has an unknown suffix {c:?}; use K, M, B (billion) or T, or 7.5e9")),
    };
    let v = x * mult;
    if !v.is_finite() {
        return Err(format!("{s:?} is not finite"));
    }
    if v < 1.0 {
        return Err(format!("{s:?} must be at least 1"));
    }
    // Exact integers survive the multiplication up to 2⁵³; beyond that
    // the nearest float is the value meant.
    if v.fract() != 0.0 {
        return Err(format!("{s:?} is not a whole number"));
    }
    if v > 9.0e18 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(v as u64)
}

/// A byte size: a non-negative number with an optional decimal (`GB` =
/// 10⁹) or binary (`GiB` = 2³⁰) unit, e.g. `80GB`, `80GiB`, `1e9`,
/// `512MiB`. The error names what was wrong with `s`.
pub fn parse_bytes(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    // `1e9` keeps its `e`; a unit never starts with e.
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let x: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (write 80GB for 80·10⁹ bytes, 80GiB for 80·2³⁰, or 1e9)"))?;
    let mult = match unit {
        "" | "B" | "b" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "PB" => 1e15,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        "PiB" => 1024f64.powi(5),
        "K" | "k" | "M" | "G" | "T" | "P" => {
            return Err(format!(
                "{s:?} is ambiguous: write {num}{unit}B for powers of 1000 or {num}{unit}iB for powers of 1024"
            ));
        }
        _ => return Err(format!("{s:?} has an unknown unit {unit:?}; use B, KB, MB, GB, TB or KiB, MiB, GiB, TiB")),
    };
    let v = x * mult;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?} must be a finite size of at least 0 bytes"));
    }
    Ok(v + 0.0)
}

/// A non-negative, finite number of bytes per parameter (`2`, `0.5`, `12`).
pub fn parse_bytes_per_param(s: &str) -> Result<f64, String> {
    let v: f64 =
        s.trim().parse().map_err(|_| format!("{s:?} is not a number of bytes per parameter (e.g. 2, 4, 12)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?} must be a finite number of bytes of at least 0"));
    }
    Ok(v + 0.0)
}

/// `bytes` in decimal gigabytes (10⁹).
pub fn gb(bytes: f64) -> f64 {
    bytes / 1e9
}

/// `bytes` in binary gibibytes (2³⁰).
pub fn gib(bytes: f64) -> f64 {
    bytes / 1024f64.powi(3)
}

/// `bytes` as `"31.41 GB (29.25 GiB)"`: the decimal and the binary unit
/// of the same rank (KB/KiB, MB/MiB, GB/GiB, TB/TiB; plain bytes below
/// 1000), four significant digits.
pub fn format_gb_gib(bytes: f64) -> String {
    match level(bytes) {
        0 => format!("{} B", short(bytes)),
        k => format!(
            "{} {}B ({} {}iB)",
            short(bytes / 1e3f64.powi(k)),
            PREFIX[k as usize],
            short(bytes / 1024f64.powi(k)),
            PREFIX[k as usize]
        ),
    }
}

/// `bytes` with a decimal unit: `1.875 GB`, `994 B`.
pub fn format_bytes(bytes: f64) -> String {
    match level(bytes) {
        0 => format!("{} B", short(bytes)),
        k => format!("{} {}B", short(bytes / 1e3f64.powi(k)), PREFIX[k as usize]),
    }
}

const PREFIX: [&str; 5] = ["", "K", "M", "G", "T"];

/// 0 for bytes, 1 for KB … 4 for TB (GB up to 10¹³, so GPU sizes and
/// the ZeRO paper's numbers stay in GB).
fn level(bytes: f64) -> i32 {
    match bytes.abs() {
        b if b < 1e3 => 0,
        b if b < 1e6 => 1,
        b if b < 1e9 => 2,
        b if b < 1e13 => 3,
        _ => 4,
    }
}

/// A count as people say it: `7.5e9` → `7.5B`, `70e9` → `70B`, `1e12` →
/// `1T`, `64` → `64`.
pub fn format_count(n: f64) -> String {
    for (unit, scale) in [("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)] {
        if n >= scale {
            return format!("{}{unit}", short(n / scale));
        }
    }
    short(n)
}

/// Up to four significant digits, trailing zeros dropped: `1.875`,
/// `31.41`, `1120`, `0.01172`.
pub fn short(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_in_every_spelling() {
        assert_eq!(parse_count("64"), Ok(64));
        assert_eq!(parse_count("7.5e9"), Ok(7_500_000_000));
        assert_eq!(parse_count("70e9"), Ok(70_000_000_000));
        assert_eq!(parse_count("7.5B"), Ok(7_500_000_000));
        assert_eq!(parse_count("175M"), Ok(175_000_000));
        assert_eq!(parse_count("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_count("1_024"), Ok(1024));
        assert_eq!(parse_count("1E12"), Ok(1_000_000_000_000));
    }

    #[test]
    fn counts_refuse_nonsense_and_say_why() {
        assert!(parse_count("0").unwrap_err().contains("at least 1"));
        assert!(parse_count("-8").unwrap_err().contains("at least 1"));
        assert!(parse_count("2.5").unwrap_err().contains("whole number"));
        assert!(parse_count("lots").unwrap_err().contains("not a number"));
        assert!(parse_count("7X").unwrap_err().contains("unknown suffix"));
        assert!(parse_count("inf").unwrap_err().contains("not finite"));
        assert!(parse_count("1e30").unwrap_err().contains("too large"));
    }

    #[test]
    fn gigabytes_are_decimal_and_gibibytes_binary() {
        assert_eq!(parse_bytes("80GB"), Ok(80e9));
        assert_eq!(parse_bytes("80GiB"), Ok(80.0 * 1024f64.powi(3)));
        assert_eq!(parse_bytes("1e9"), Ok(1e9));
        assert_eq!(parse_bytes("512 MiB"), Ok(512.0 * 1024f64.powi(2)));
        assert_eq!(parse_bytes("0"), Ok(0.0));
        assert_eq!(parse_bytes("2.5TB"), Ok(2.5e12));
        assert!(parse_bytes("80G").unwrap_err().contains("ambiguous"));
        assert!(parse_bytes("80 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("-1GB").unwrap_err().contains("at least 0"));
        assert!(parse_bytes("GB").unwrap_err().contains("not a size"));
    }

    #[test]
    fn printing_keeps_four_digits() {
        assert_eq!(short(1.875), "1.875");
        assert_eq!(short(31.40625), "31.41");
        assert_eq!(short(1120.0), "1120");
        assert_eq!(short(0.011_718_75), "0.01172");
        assert_eq!(format_count(7.5e9), "7.5B");
        assert_eq!(format_count(1e12), "1T");
        assert_eq!(format_gb_gib(120e9), "120 GB (111.8 GiB)");
        assert_eq!(format_gb_gib(1120e9), "1120 GB (1043 GiB)");
        assert_eq!(format_gb_gib(2048.0), "2.048 KB (2 KiB)");
        assert_eq!(format_gb_gib(0.0), "0 B");
        assert_eq!(format_bytes(994.0), "994 B");
        assert_eq!(format_bytes(1.6e15), "1600 TB");
    }
}
