//! Units in messages: byte counts a reader can take in at a glance, so that a 600 KB budget
//! does not read as "0.00 GiB". Shared by every engine's errors and reports and the planners'.

/// Human-readable byte count in binary units: `"2.00 GiB"`, `"180.0 MiB"`, `"4.0 KiB"`,
/// `"512 B"` (two decimals for GiB, one for MiB and KiB).
pub fn fmt_bytes(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let b = bytes as f64;
    if bytes >= GIB {
        format!("{:.2} GiB", b / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", b / MIB as f64)
    } else if bytes >= KIB {
        format!("{:.1} KiB", b / KIB as f64)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::fmt_bytes;

    #[test]
    fn small_budgets_show_in_a_unit_that_shows_them() {
        assert_eq!(fmt_bytes(600_000), "585.9 KiB");
        assert_eq!(fmt_bytes(3 << 20), "3.0 MiB");
        assert_eq!(fmt_bytes(5 << 30), "5.00 GiB");
        assert_eq!(fmt_bytes(12), "12 B");
    }
}
