use super::*;

#[test]
fn c_formats() {
    assert_eq!(c_g(0.0), "0");
    assert_eq!(c_g(1.0), "1");
    assert_eq!(c_g(12.3456789), "12.3457");
    assert_eq!(c_g(0.0001234), "0.0001234");
    assert_eq!(c_g(0.00001234), "1.234e-05");
    assert_eq!(c_g(123456.0), "123456");
    assert_eq!(c_g(1234567.0), "1.23457e+06");
    assert_eq!(c_g(100.0), "100");
    assert_eq!(c_g(f64::NAN), "nan");
    assert_eq!(c_exp(12345678.0, 1, 7), "1.2e+07");
    assert_eq!(c_exp(0.5, 0, 6), " 5e-01");
}

#[test]
fn fit_follows_get_float_str() {
    // time: width 7
    assert_eq!(fit(0.5, 7), "   0.50");
    assert_eq!(fit(12.345, 7), "  12.35");
    assert_eq!(fit(9999.99, 7), "9999.99");
    assert_eq!(fit(12345.6, 7), "12345.6");
    assert_eq!(fit(123456.4, 7), " 123456");
    assert_eq!(fit(1234567.0, 7), "1234567");
    assert_eq!(fit(12345678.0, 7), "1.2e+07");
    // bandwidth: width 6
    assert_eq!(fit(0.0, 6), "  0.00");
    assert_eq!(fit(1.5, 6), "  1.50");
    assert_eq!(fit(123.456, 6), "123.46");
    assert_eq!(fit(1234.5, 6), "1234.5");
    assert_eq!(fit(12345.0, 6), " 12345");
    assert_eq!(fit(123456.0, 6), "123456");
    assert_eq!(fit(1234567.0, 6), " 1e+06");
}

#[test]
fn lines_have_nccl_tests_widths() {
    let h = header(Columns::default());
    let lines: Vec<&str> = h.lines().collect();
    assert_eq!(lines[0], "#");
    assert_eq!(
        lines[2],
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
    );
    assert_eq!(
        lines[3],
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
    );
    assert_eq!(lines[2].len(), lines[3].len());
    assert!(lines[1].contains("out-of-place") && lines[1].contains("in-place"));
    let row = row_start(1048576, 262144, "float", "sum", -1)
        + &block(63.5, 16.51, 24.77, Some(0))
        + &block(61.0, 17.19, 25.78, None);
    assert_eq!(
        row,
        "     1048576        262144     float     sum      -1    63.50   16.51   24.77       0    61.00   17.19   25.78    N/A"
    );
    // Columns line up with the header's (N/A is one narrower, as in nccl-tests).
    assert_eq!(row.len() + 1, lines[2].trim_end().len());
    let checked = row_start(8, 2, "float", "sum", -1) + &block(1.0, 0.0, 0.0, Some(0)) + &block(1.0, 0.0, 0.0, Some(3));
    assert_eq!(checked.len(), lines[2].trim_end().len());
    let t = header(Columns { cputime: true, timestamps: true, per_iter: false });
    assert!(
        t.lines().nth(2).unwrap().contains("cputime") && t.lines().nth(2).unwrap().ends_with("          timestamp")
    );
    let p = header(Columns { per_iter: true, ..Columns::default() });
    assert_eq!(p.lines().nth(2).unwrap().matches("i_p99").count(), 2);
}

#[test]
fn footer_and_stats() {
    let f = footer(0, 12.5, None, "all_reduce_perf");
    assert_eq!(
        f,
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 12.5 \n#\n# Collective test concluded: all_reduce_perf\n#\n\n"
    );
    assert!(footer(2, 1.0, Some(5.0), "x").contains(": 2 FAILED\n# Avg bus bandwidth    : 1 FAILED"));
    let s = IterStats::of(&[3.0, 1.0, 2.0, 4.0]);
    assert_eq!((s.min, s.max, s.avg, s.p50, s.p99), (1.0, 4.0, 2.5, 3.0, 4.0));
    assert!((s.cv_pct() - 44.72135954999579).abs() < 1e-9);
}

#[test]
fn timestamps() {
    use std::time::Duration;
    assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01 00:00:00");
    assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(951_827_696)), "2000-02-29 12:34:56");
}
