//! NCCL's built-in reduction operations, and what each computes, on the host.

use metrale_gpu_sys::nccl::ncclRedOp_t;

/// A built-in reduction operation (`ncclRedOp_t`'s first five values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg];

    /// The name nccl-tests gives it (`-o sum`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
        }
    }

    pub fn nccl(self) -> ncclRedOp_t {
        match self {
            Op::Sum => ncclRedOp_t::ncclSum,
            Op::Prod => ncclRedOp_t::ncclProd,
            Op::Max => ncclRedOp_t::ncclMax,
            Op::Min => ncclRedOp_t::ncclMin,
            Op::Avg => ncclRedOp_t::ncclAvg,
        }
    }

    /// The exact reduction of `values` (at least one), in `f64`: the reference a floating-point result
    /// is compared with (`avg` is the sum divided by the count).
    pub fn reduce_f64(self, values: &[f64]) -> f64 {
        let first = values[0];
        let rest = values[1..].iter().copied();
        match self {
            Op::Sum => rest.fold(first, |a, b| a + b),
            Op::Avg => rest.fold(first, |a, b| a + b) / values.len() as f64,
            Op::Prod => rest.fold(first, |a, b| a * b),
            Op::Max => rest.fold(first, f64::max),
            Op::Min => rest.fold(first, f64::min),
        }
    }

    /// The reduction of integer `values` (raw bits, at least one) as a GPU computes it in a `width`-bit
    /// type: sums and products wrap, max and min compare as signed or unsigned. `None` for `avg`,
    /// which the suites run on floating types only.
    pub fn reduce_int(self, values: &[u64], width: u32, signed: bool) -> Option<u64> {
        let mask = if width == 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        let key = |x: u64| -> i128 {
            if signed {
                let shift = 64 - width;
                i128::from(((x << shift) as i64) >> shift)
            } else {
                i128::from(x)
            }
        };
        let first = values[0] & mask;
        let rest = values[1..].iter().map(|&x| x & mask);
        Some(match self {
            Op::Sum => rest.fold(first, |a, b| a.wrapping_add(b) & mask),
            Op::Prod => rest.fold(first, |a, b| a.wrapping_mul(b) & mask),
            Op::Max => rest.fold(first, |a, b| if key(b) > key(a) { b } else { a }),
            Op::Min => rest.fold(first, |a, b| if key(b) < key(a) { b } else { a }),
            Op::Avg => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_reductions_wrap_and_compare_by_sign() {
        assert_eq!(Op::Sum.reduce_int(&[0xff, 0x02], 8, false), Some(0x01));
        assert_eq!(Op::Prod.reduce_int(&[0x10, 0x10], 8, true), Some(0x00));
        assert_eq!(Op::Max.reduce_int(&[0xff, 0x01], 8, true), Some(0x01)); // -1 < 1
        assert_eq!(Op::Max.reduce_int(&[0xff, 0x01], 8, false), Some(0xff));
        assert_eq!(Op::Min.reduce_int(&[u64::MAX, 3], 64, true), Some(u64::MAX));
        assert_eq!(Op::Avg.reduce_int(&[1, 2], 32, true), None);
    }

    #[test]
    fn float_reductions() {
        assert_eq!(Op::Sum.reduce_f64(&[1.5, 2.0, -0.5]), 3.0);
        assert_eq!(Op::Avg.reduce_f64(&[1.0, 2.0]), 1.5);
        assert_eq!(Op::Prod.reduce_f64(&[1.5, -2.0]), -3.0);
        assert_eq!(Op::Max.reduce_f64(&[1.5, -2.0]), 1.5);
        assert_eq!(Op::Min.reduce_f64(&[1.5, -2.0]), -2.0);
    }

    #[test]
    fn names_and_values_follow_nccl() {
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op.nccl().0 as usize, i, "{}", op.name());
        }
    }
}
