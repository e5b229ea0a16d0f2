//! The data the check uses: a deterministic input pattern per rank, the expected outputs computed on the
//! host, and the element types as the host sees them. The C twin (c/perf_twin.c) uses the same
//! patterns, so both programs check the same values.
//!
//! Values are small integers, exact in every type, so sums, products, minima and maxima are exact too
//! (integer types wrap as the GPU does). Only `avg` on floating types rounds (NCCL multiplies each input by
//! 1/n before summing), so it is compared within a tolerance.

use metrale_gpu_testkit::codec::{BF16, FP16};

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

/// A 16-bit floating type, by its bits, converted with the testkit's codec (to nearest, ties to even, as
/// CUDA converts).
macro_rules! narrow_elem {
    ($($t:ident: $format:ident),*) => {$(
        impl Elem for $t {
            fn from_i64(v: i64) -> Self {
                $t($format.encode(v as f64))
            }
            fn from_f64(v: f64) -> Self {
                $t($format.encode(v))
            }
            fn to_f64(self) -> f64 {
                $format.decode(self.0)
            }
        }
    )*};
}
narrow_elem!(F16: FP16, Bf16: BF16);

/// Runs `$body` with `$t` bound to the host type of `$dtype`.
macro_rules! with_elem {
    ($dtype:expr, $t:ident => $body:expr) => {
        $crate::data::with_elem!(@arms $dtype, $t, $body;
            Int8: i8, Uint8: u8, Int32: i32, Uint32: u32, Int64: i64, Uint64: u64,
            Half: $crate::data::F16, Float: f32, Double: f64, Bfloat16: $crate::data::Bf16)
    };
    (@arms $dtype:expr, $t:ident, $body:expr; $($variant:ident: $host:ty),*) => {
        match $dtype {
            $($crate::args::DType::$variant => {
                type $t = $host;
                $body
            })*
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The narrow types carry their own format's bits (the GPU reads them as `__half` / `__nv_bfloat16`).
    #[test]
    fn narrow_types_hold_their_formats_bits() {
        assert_eq!(F16::from_i64(1), F16(0x3c00));
        assert_eq!(Bf16::from_i64(1), Bf16(0x3f80));
        assert_eq!(F16::from_i64(-2).to_f64(), -2.0);
        assert_eq!(Bf16::from_f64(3.140625).0, 0x4049);
        // Every value of the patterns is exact in every type.
        for v in 0..COPY_PERIOD as i64 {
            assert_eq!(F16::from_i64(v).to_f64(), v as f64);
            assert_eq!(Bf16::from_i64(v).to_f64(), v as f64, "bf16 {v}");
        }
    }
}
