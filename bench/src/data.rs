//! The data the check uses: a deterministic input pattern per rank, the expected outputs computed on the
//! host, and the element types as the host sees them. The C twin (c/perf_twin.c) uses the same
//! patterns, so both programs check the same values.
//!
//! Values are small integers, exact in every type, so sums, products, minima and maxima are exact too
//! (integer types wrap as the GPU does). Only `avg` on floating types rounds (NCCL multiplies each input by
//! 1/n before summing), so it is compared within a tolerance.

use crate::args::{DType, Op};

/// Period of the pattern reductions use: rank r's element i is `(3i + 7r) mod 13` (`prod`: 1 or 2).
pub const REDUCE_PERIOD: usize = 13;
/// Period of the pattern copies use (gather, broadcast, all-to-all, send/recv): `(3i + 11r) mod 101`.
pub const COPY_PERIOD: usize = 101;

/// What a rank's input holds, as a small integer: for reductions (`Some(op)`) or for copies (`None`).
pub fn input_value(op: Option<Op>, rank: usize, index: usize) -> i64 {
    match op {
        Some(op) => {
            let base = ((3 * index + 7 * rank) % REDUCE_PERIOD) as i64;
            if op == Op::Prod {
                1 + (base & 1)
            } else {
                base
            }
        }
        None => ((3 * index + 11 * rank) % COPY_PERIOD) as i64,
    }
}

/// The pattern's period for `op`.
pub fn period(op: Option<Op>) -> usize {
    match op {
        Some(_) => REDUCE_PERIOD,
        None => COPY_PERIOD,
    }
}

/// An element type as the host handles it.
pub trait Elem: Copy + Default + PartialEq + 'static {
    /// The value `v` in this type; integer types wrap (two's complement), as the GPU's arithmetic does.
    fn from_i64(v: i64) -> Self;
    /// Rounded to this type (for the expected value of a floating-point `avg`).
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

impl Elem for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Elem for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
}

/// IEEE half precision, by its bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16, by its bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// f32 to half, rounding to nearest even (normals, subnormals, infinities, NaN).
pub fn f32_to_f16(value: f32) -> u16 {
    let x = value.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && (h & 1) == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1; // may carry into the exponent, up to infinity: correct
    }
    sign | h as u16
}

/// Half to f64, exactly.
pub fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((bits >> 10) & 0x1f) as i32;
    let mant = (bits & 0x3ff) as f64;
    match exp {
        0 => sign * mant * 2f64.powi(-24),
        0x1f if mant == 0.0 => sign * f64::INFINITY,
        0x1f => f64::NAN,
        _ => sign * (1.0 + mant / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// f32 to bfloat16, rounding to nearest even.
pub fn f32_to_bf16(value: f32) -> u16 {
    let x = value.to_bits();
    if value.is_nan() {
        return ((x >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(round) >> 16) as u16
}

impl Elem for F16 {
    fn from_i64(v: i64) -> Self {
        F16(f32_to_f16(v as f32))
    }
    fn from_f64(v: f64) -> Self {
        F16(f32_to_f16(v as f32))
    }
    fn to_f64(self) -> f64 {
        f16_to_f64(self.0)
    }
}

impl Elem for Bf16 {
    fn from_i64(v: i64) -> Self {
        Bf16(f32_to_bf16(v as f32))
    }
    fn from_f64(v: f64) -> Self {
        Bf16(f32_to_bf16(v as f32))
    }
    fn to_f64(self) -> f64 {
        f32::from_bits((self.0 as u32) << 16) as f64
    }
}

/// Runs `$body` with `$t` bound to the host type of `$dtype`.
macro_rules! with_elem {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::args::DType::Int8 => {
                type $t = i8;
                $body
            }
            $crate::args::DType::Uint8 => {
                type $t = u8;
                $body
            }
            $crate::args::DType::Int32 => {
                type $t = i32;
                $body
            }
            $crate::args::DType::Uint32 => {
                type $t = u32;
                $body
            }
            $crate::args::DType::Int64 => {
                type $t = i64;
                $body
            }
            $crate::args::DType::Uint64 => {
                type $t = u64;
                $body
            }
            $crate::args::DType::Half => {
                type $t = $crate::data::F16;
                $body
            }
            $crate::args::DType::Float => {
                type $t = f32;
                $body
            }
            $crate::args::DType::Double => {
                type $t = f64;
                $body
            }
            $crate::args::DType::Bfloat16 => {
                type $t = $crate::data::Bf16;
                $body
            }
        }
    };
}
pub(crate) use with_elem;

/// One period of rank `rank`'s input, in type T: element i of the input is `table[i % len]`.
pub fn input_table<T: Elem>(op: Option<Op>, rank: usize) -> Vec<T> {
    (0..period(op))
        .map(|i| T::from_i64(input_value(op, rank, i)))
        .collect()
}

/// What the output must hold, one period of it: the values, and the tolerance of each comparison.
pub struct Expected {
    pub values: Vec<f64>,
    pub tolerance: f64,
}

/// A copy of rank `source`'s input.
pub fn expected_copy<T: Elem>(source: usize) -> Expected {
    Expected {
        values: (0..COPY_PERIOD)
            .map(|i| T::from_i64(input_value(None, source, i)).to_f64())
            .collect(),
        tolerance: 0.0,
    }
}

/// `op` over the inputs of ranks 0..n, element by element.
pub fn expected_reduction<T: Elem>(op: Op, n: usize, dtype: DType) -> Expected {
    let float = dtype.is_float();
    let values = (0..REDUCE_PERIOD)
        .map(|i| {
            let inputs = (0..n).map(|r| input_value(Some(op), r, i));
            let v = match op {
                Op::Sum => T::from_i64(inputs.sum()),
                Op::Prod => T::from_i64(inputs.fold(1i64, |a, b| a.wrapping_mul(b))),
                Op::Max => T::from_i64(inputs.max().unwrap_or(0)),
                Op::Min => T::from_i64(inputs.min().unwrap_or(0)),
                Op::Avg if float => T::from_f64(inputs.sum::<i64>() as f64 / n as f64),
                Op::Avg => T::from_i64(inputs.sum::<i64>() / n as i64),
            };
            v.to_f64()
        })
        .collect();
    // Floating avg: each input is multiplied by 1/n in the type, then summed: a few ulps of the largest sum.
    let tolerance = if float && op == Op::Avg {
        let eps = match dtype {
            DType::Half => 2f64.powi(-10),
            DType::Bfloat16 => 2f64.powi(-7),
            DType::Float => 2f64.powi(-23),
            _ => 2f64.powi(-52),
        };
        (n as f64 + 2.0) * eps * (REDUCE_PERIOD as f64)
    } else {
        0.0
    };
    Expected { values, tolerance }
}

/// Counts the elements of `got` that differ from the expected pattern, element `k` of `got` being
/// element `start + k` of the pattern.
pub fn count_wrong<T: Elem>(got: &[T], expected: &Expected, start: usize) -> u64 {
    let period = expected.values.len();
    let mut k = start % period;
    let mut wrong = 0u64;
    for &x in got {
        let want = expected.values[k];
        let v = x.to_f64();
        // Within the tolerance, or wrong (a NaN compares as neither).
        let close = (v - want).abs() <= expected.tolerance;
        if !close {
            wrong += 1;
        }
        k += 1;
        if k == period {
            k = 0;
        }
    }
    wrong
}

/// `table` repeated to `len + table.len()` elements: any `len` elements of the pattern, from any phase,
/// are then one contiguous slice (`&tiled[start % period..][..len]`), ready to copy or compare at memcpy speed.
pub fn tile<T: Copy>(table: &[T], len: usize) -> Vec<T> {
    table
        .iter()
        .copied()
        .cycle()
        .take(len + table.len())
        .collect()
}

/// The expected values in type T (exact wherever the tolerance is 0).
pub fn typed<T: Elem>(expected: &Expected) -> Vec<T> {
    expected.values.iter().map(|&v| T::from_f64(v)).collect()
}
