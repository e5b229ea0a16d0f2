//! The narrow floating-point formats NCCL reduces, encoded and decoded on the host: IEEE half
//! ([`FP16`]), bfloat16 ([`BF16`]) and the two 8-bit formats ([`FP8_E4M3`], [`FP8_E5M2`]), as CUDA's
//! `__half`, `__nv_bfloat16`, `__nv_fp8_e4m3` and `__nv_fp8_e5m2` define them.
//!
//! ```
//! use metrale_gpu_testkit::codec::{BF16, FP16, FP8_E4M3};
//! assert_eq!(FP16.encode(1.0), 0x3c00);
//! assert_eq!(FP16.decode(0x3c00), 1.0);
//! assert_eq!(BF16.encode(3.14159_f32.into()), 0x4049); // rounded to nearest, ties to even
//! assert_eq!(FP8_E4M3.decode(0x7e), 448.0); // its largest finite value
//! ```
//!
//! Bits travel in the low bits of a `u16` (`fp8` uses the low 8). An `f32` converts to `f64` exactly, so
//! [`Format::encode`] of `x as f64` is the correctly rounded conversion of an `f32` too.

/// A binary floating-point format: a sign bit, `exp` exponent bits, `man` mantissa bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub exp: u32,
    pub man: u32,
    /// The `fn` formats (e4m3): no infinities, and the one NaN per sign is all ones (`S.1111.111`);
    /// the largest exponent holds ordinary values.
    pub finite_only: bool,
}

/// IEEE 754 binary16 (`__half`, `ncclFloat16`).
pub const FP16: Format = Format::ieee(5, 10);
/// bfloat16 (`__nv_bfloat16`, `ncclBfloat16`): f32's exponent, 7 mantissa bits.
pub const BF16: Format = Format::ieee(8, 7);
/// fp8 e4m3 (`__nv_fp8_e4m3`, `ncclFloat8e4m3`): largest finite 448, no infinities.
pub const FP8_E4M3: Format = Format {
    exp: 4,
    man: 3,
    finite_only: true,
};
/// fp8 e5m2 (`__nv_fp8_e5m2`, `ncclFloat8e5m2`): IEEE-style, largest finite 57344.
pub const FP8_E5M2: Format = Format::ieee(5, 2);

impl Format {
    const fn ieee(exp: u32, man: u32) -> Format {
        Format {
            exp,
            man,
            finite_only: false,
        }
    }

    /// Bits of a value: 1 + `exp` + `man`.
    pub const fn bits(&self) -> u32 {
        1 + self.exp + self.man
    }

    const fn bias(&self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }

    const fn max_exp_field(&self) -> u16 {
        (1 << self.exp) - 1
    }

    const fn man_mask(&self) -> u16 {
        (1 << self.man) - 1
    }

    const fn sign_bit(&self) -> u16 {
        1 << (self.exp + self.man)
    }

    /// The NaN this codec produces (quiet, positive).
    pub const fn nan(&self) -> u16 {
        if self.finite_only {
            (self.max_exp_field() << self.man) | self.man_mask()
        } else {
            (self.max_exp_field() << self.man) | (1 << (self.man - 1))
        }
    }

    /// The value of `bits`, exactly (every value of these formats is an `f64`).
    pub fn decode(&self, bits: u16) -> f64 {
        let sign = if bits & self.sign_bit() != 0 {
            -1.0
        } else {
            1.0
        };
        let e = (bits >> self.man) & self.max_exp_field();
        let m = bits & self.man_mask();
        if self.finite_only {
            if e == self.max_exp_field() && m == self.man_mask() {
                return f64::NAN;
            }
        } else if e == self.max_exp_field() {
            return if m == 0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        let fraction = f64::from(m) / f64::from(1u32 << self.man);
        if e == 0 {
            sign * fraction * 2f64.powi(1 - self.bias())
        } else {
            sign * (1.0 + fraction) * 2f64.powi(i32::from(e) - self.bias())
        }
    }

    /// `v` rounded to the nearest value of the format, ties to even (subnormals included). Beyond the
    /// largest finite value: infinity, or NaN in a format without infinities (CUDA's non-saturating
    /// conversions do the same).
    pub fn encode(&self, v: f64) -> u16 {
        let sign = if v.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        if v.is_nan() {
            return sign | self.nan();
        }
        let a = v.abs();
        let overflow = sign
            | if self.finite_only {
                self.nan()
            } else {
                self.max_exp_field() << self.man
            };
        if a.is_infinite() {
            return overflow;
        }
        if a == 0.0 {
            return sign;
        }
        let min_normal_exp = 1 - self.bias();
        // floor(log2(a)) from the f64's own exponent field (a subnormal f64 is far below every format here).
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let man = self.man as i32;
        let (biased, quanta) = if e < min_normal_exp {
            // Subnormal: a multiple of 2^(min_normal_exp - man); 2^man quanta round up into the smallest normal.
            (0, (a * 2f64.powi(man - min_normal_exp)).round_ties_even())
        } else {
            // Normal: a = q * 2^(e - man) with q in [2^man, 2^(man+1)]; scaling by a power of 2 is exact.
            let q = (a * 2f64.powi(man - e)).round_ties_even();
            if q >= f64::from(1u32 << (man + 1)) {
                (e + 1 + self.bias(), f64::from(1u32 << man))
            } else {
                (e + self.bias(), q)
            }
        };
        let quanta = quanta as u32;
        let bits = if biased == 0 {
            quanta // may be 2^man: exponent field 1, the smallest normal, as it should
        } else {
            ((biased as u32) << self.man) | (quanta & u32::from(self.man_mask()))
        };
        let max_finite = if self.finite_only {
            (u32::from(self.max_exp_field()) << self.man) | (u32::from(self.man_mask()) - 1)
        } else {
            (u32::from(self.max_exp_field()) << self.man) - 1
        };
        if biased > i32::from(self.max_exp_field()) || bits > max_finite {
            return overflow;
        }
        sign | bits as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_decode() {
        assert_eq!(FP16.decode(0x3c00), 1.0);
        assert_eq!(FP16.decode(0xc000), -2.0);
        assert_eq!(FP16.decode(0x7bff), 65504.0);
        assert_eq!(FP16.decode(0x0001), 2f64.powi(-24));
        assert!(FP16.decode(0x7c00).is_infinite());
        assert!(FP16.decode(0x7e00).is_nan());
        assert_eq!(BF16.decode(0x3f80), 1.0);
        assert_eq!(BF16.decode(0x4049), 3.140625);
        assert_eq!(FP8_E4M3.decode(0x38), 1.0);
        assert_eq!(FP8_E4M3.decode(0x7e), 448.0);
        assert!(FP8_E4M3.decode(0x7f).is_nan());
        assert!(FP8_E4M3.decode(0xff).is_nan());
        assert_eq!(FP8_E4M3.decode(0x01), 2f64.powi(-9));
        assert_eq!(FP8_E5M2.decode(0x3c), 1.0);
        assert_eq!(FP8_E5M2.decode(0x7b), 57344.0);
        assert!(FP8_E5M2.decode(0x7c).is_infinite());
    }

    /// Every bit pattern that is a number encodes back to itself; NaNs encode to a NaN.
    #[test]
    fn every_value_round_trips() {
        for format in [FP16, BF16, FP8_E4M3, FP8_E5M2] {
            for bits in 0..(1u32 << format.bits()) {
                let bits = bits as u16;
                let v = format.decode(bits);
                let back = format.encode(v);
                if v.is_nan() {
                    assert!(format.decode(back).is_nan(), "{format:?} {bits:#x}");
                } else {
                    assert_eq!(
                        back, bits,
                        "{format:?}: {bits:#x} = {v} encodes to {back:#x}"
                    );
                }
            }
        }
    }

    /// Halfway between two neighbours rounds to the even one; just past halfway rounds away.
    #[test]
    fn rounding_is_to_nearest_even() {
        for format in [FP16, BF16, FP8_E4M3, FP8_E5M2] {
            // Positive finite patterns in order, each with its successor.
            for bits in 1..(1u16 << (format.bits() - 1)) - 1 {
                let (lo, hi) = (format.decode(bits), format.decode(bits + 1));
                if !hi.is_finite() || hi.is_nan() {
                    continue;
                }
                let mid = (lo + hi) / 2.0;
                let even = if bits % 2 == 0 { bits } else { bits + 1 };
                assert_eq!(
                    format.encode(mid),
                    even,
                    "{format:?} halfway past {bits:#x}"
                );
                assert_eq!(format.encode(-mid), even | format.sign_bit());
                let nudge = (hi - lo) / 1024.0;
                assert_eq!(format.encode(mid - nudge), bits, "{format:?} below halfway");
                assert_eq!(
                    format.encode(mid + nudge),
                    bits + 1,
                    "{format:?} above halfway"
                );
            }
        }
    }

    #[test]
    fn overflow_and_specials() {
        assert_eq!(FP16.encode(65520.0), 0x7c00); // halfway past the largest finite: infinity
        assert_eq!(FP16.encode(65519.0), 0x7bff);
        assert_eq!(FP16.encode(f64::NEG_INFINITY), 0xfc00);
        assert_eq!(FP16.encode(-0.0), 0x8000);
        assert_eq!(FP16.encode(1e-10), 0);
        assert_eq!(BF16.encode(f64::from(f32::MAX)), 0x7f80); // rounds up past bf16's largest
        assert_eq!(FP8_E4M3.encode(448.0), 0x7e);
        assert_eq!(FP8_E4M3.encode(464.0), 0x7e); // halfway to the (absent) next value: ties to even 448
        assert_eq!(FP8_E4M3.encode(465.0), 0x7f); // past it: NaN
        assert_eq!(FP8_E4M3.encode(-1e9), 0xff);
        assert_eq!(FP8_E5M2.encode(1e9), 0x7c);
        assert!(FP8_E5M2.decode(FP8_E5M2.encode(f64::NAN)).is_nan());
        assert!(FP16.decode(FP16.encode(f64::NAN)).is_nan());
    }

    /// bfloat16 is f32's top half: rounding f32 bits by the usual integer trick agrees everywhere sampled.
    #[test]
    fn bf16_agrees_with_f32_bit_rounding() {
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if f.is_nan() || f.is_infinite() {
                continue;
            }
            let trick = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
            assert_eq!(BF16.encode(f64::from(f)), trick, "{f:e} ({x:#x})");
        }
    }
}
