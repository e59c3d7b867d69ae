//! Text formats shared by the model's `Display` impls: tracemalloc's
//! `_format_size`, Python's `int / int` and Python's `repr()` of a string.

/// Units of `_format_size`, in the order it tries them.
const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// A size in bytes as tracemalloc's `_format_size(size, sign)` writes it.
///
/// `sign` adds `+` to non-negative values (used for `size_diff`). Below
/// 10 KiB the exact byte count is shown (`"10239 B"`); above, the value is
/// divided by 1024 until it fits: 3 significant digits below 100 of a unit
/// (`"10.0 KiB"`, `"99.9 MiB"`), else whole units (`"100 KiB"`), TiB being
/// the last unit (`"8388608 TiB"`).
#[must_use]
pub fn format_size(size: i64, sign: bool) -> String {
    // `i64 -> f64` rounds to nearest; every later step divides by 1024 (exact),
    // so this equals Python's correctly rounded `int / 1024` chain.
    format_size_f64(size as f64, sign)
}

/// [`format_size`] for a size in bytes that is not a whole number, such as
/// an average (`Statistic.size / Statistic.count`), exactly as
/// `_format_size(float, sign)`.
#[must_use]
pub fn format_size_f64(size: f64, sign: bool) -> String {
    let mut size = size;
    let mut units = UNITS.iter().peekable();
    while let Some(unit) = units.next() {
        let last = units.peek().is_none();
        if size.abs() < 100.0 && *unit != "B" {
            // 3 digits (xx.x UNIT)
            return if sign {
                format!("{size:+.1} {unit}")
            } else {
                format!("{size:.1} {unit}")
            };
        }
        if size.abs() < 10.0 * 1024.0 || last {
            // 4 or 5 digits (xxxx UNIT)
            return if sign {
                format!("{size:+.0} {unit}")
            } else {
                format!("{size:.0} {unit}")
            };
        }
        size /= 1024.0;
    }
    // Not reached: the last unit always returns above.
    String::new()
}

/// `a / b` correctly rounded to the nearest `f64` (ties to even), as Python's
/// `int / int` computes it; `None` when `b` is 0.
///
/// Plain `a as f64 / b as f64` rounds twice once an operand exceeds 2^53.
#[must_use]
pub fn true_div(a: u64, b: u64) -> Option<f64> {
    const EXACT: u64 = 1 << 53;
    if b == 0 {
        return None;
    }
    if a == 0 {
        return Some(0.0);
    }
    if a <= EXACT && b <= EXACT {
        // Both operands are exact, and IEEE division rounds once.
        return Some(a as f64 / b as f64);
    }
    let bits_a = i32::try_from(u64::BITS - a.leading_zeros()).ok()?;
    let bits_b = i32::try_from(u64::BITS - b.leading_zeros()).ok()?;
    // Scale so that the integer quotient has 55 or 56 bits: 53 for the
    // mantissa plus guard bits; the remainder supplies the sticky bit.
    let scale = 55 - (bits_a - bits_b);
    let (num, den) = if scale >= 0 {
        // bits_a + scale = 55 + bits_b <= 119: fits.
        (u128::from(a) << scale, u128::from(b))
    } else {
        // -scale <= 64 - 1 - 55: fits.
        (u128::from(a), u128::from(b) << (-scale))
    };
    let quotient = num / den;
    let sticky = num % den != 0;
    let quotient_bits = i32::try_from(u128::BITS - quotient.leading_zeros()).ok()?;
    let drop = quotient_bits - 53;
    let mut mantissa = quotient >> drop;
    let dropped = quotient & ((1u128 << drop) - 1);
    let half = 1u128 << (drop - 1);
    if dropped > half || (dropped == half && (sticky || mantissa & 1 == 1)) {
        mantissa += 1;
    }
    // mantissa <= 2^53 is exact in f64; the exponent stays far from the
    // subnormal and overflow ranges (|a / b| is within 2^-64 .. 2^64), so
    // multiplying by a power of two is exact.
    let exponent = drop - scale;
    let power = f64::from_bits(u64::try_from(1023 + exponent).ok()? << 52);
    Some(mantissa as f64 * power)
}

/// Python's `repr()` of a string: single quotes unless the text holds a `'`
/// and no `"`, with backslash escapes for quotes, backslashes and control
/// characters. Used in error messages that quote a user's value as CPython
/// does (`unknown key_type: 'x'`).
#[must_use]
pub fn py_repr_str(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let code = u32::from(c);
                if code <= 0xff {
                    out.push_str(&format!("\\x{code:02x}"));
                } else {
                    out.push_str(&format!("\\u{code:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_switches_units_at_tracemalloc_boundaries() {
        let cases: [(i64, &str, &str); 19] = [
            (0, "0 B", "+0 B"),
            (1, "1 B", "+1 B"),
            (-1, "-1 B", "-1 B"),
            (99, "99 B", "+99 B"),
            (100, "100 B", "+100 B"),
            (1023, "1023 B", "+1023 B"),
            (1024, "1024 B", "+1024 B"),
            (10239, "10239 B", "+10239 B"),
            (10240, "10.0 KiB", "+10.0 KiB"),
            (-10239, "-10239 B", "-10239 B"),
            (-10240, "-10.0 KiB", "-10.0 KiB"),
            (102_399, "100.0 KiB", "+100.0 KiB"),
            (102_400, "100 KiB", "+100 KiB"),
            (10 * 1024 * 1024 - 1, "10240 KiB", "+10240 KiB"),
            (104_857_599, "100.0 MiB", "+100.0 MiB"),
            (100 << 40, "100 TiB", "+100 TiB"),
            (10240 << 40, "10240 TiB", "+10240 TiB"),
            (i64::MAX, "8388608 TiB", "+8388608 TiB"),
            (i64::MIN, "-8388608 TiB", "-8388608 TiB"),
        ];
        for (size, plain, signed) in cases {
            assert_eq!(format_size(size, false), plain, "size {size}");
            assert_eq!(format_size(size, true), signed, "size {size} signed");
        }
    }

    #[test]
    fn format_size_f64_rounds_half_to_even_like_percent_format() {
        assert_eq!(format_size_f64(0.5, false), "0 B");
        assert_eq!(format_size_f64(1.5, false), "2 B");
        assert_eq!(format_size_f64(2.5, false), "2 B");
        assert_eq!(format_size_f64(2.5, true), "+2 B");
        // 99.95 KiB rounds up to "100.0 KiB", as Python prints it.
        assert_eq!(format_size_f64(99.95 * 1024.0, false), "100.0 KiB");
        assert_eq!(format_size_f64(10.25 * 1024.0, false), "10.2 KiB");
    }

    #[test]
    fn true_div_is_correctly_rounded_like_python() {
        assert_eq!(true_div(7, 2), Some(3.5));
        assert_eq!(true_div(1, 0), None);
        assert_eq!(true_div(0, u64::MAX), Some(0.0));
        // Values printed by Python 3.11 `repr(a / b)`.
        assert_eq!(true_div((1 << 60) + 1, 3), Some(3.843_071_682_022_823e17));
        // Naive f64 division gives 2048.0 here.
        assert_eq!(
            true_div(u64::MAX, (1 << 53) + 1),
            Some(2_047.999_999_999_999_8)
        );
        assert_eq!(
            true_div(12_345_678_901_234_567_891, 7),
            Some(1.763_668_414_462_081e18)
        );
        assert_eq!(true_div(1, u64::MAX), Some(5.421_010_862_427_522e-20));
        assert_eq!(
            true_div((1 << 63) + (1 << 10) + 1, 1 << 11),
            Some(4_503_599_627_370_497.0)
        );
    }

    #[test]
    fn py_repr_str_quotes_like_python() {
        assert_eq!(py_repr_str("lines"), "'lines'");
        assert_eq!(py_repr_str("it's"), "\"it's\"");
        assert_eq!(py_repr_str("a\"b'c"), "'a\"b\\'c'");
        assert_eq!(py_repr_str("x\ty\u{7f}\u{1}é"), "'x\\ty\\x7f\\x01é'");
    }
}
