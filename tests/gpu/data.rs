//! Host-side data: a seeded generator, NCCL's data types decoded on the host (fp16, bf16 and both fp8
//! formats included), and the checks that compare what a GPU produced with what the host computes.

use metrale_gpu_sys::nccl::{ncclDataType_t, ncclRedOp_t};

/// splitmix64: fast, seedable, good enough to make every element different.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The seed of rank `rank`'s data in case `case`: every process can rebuild every rank's input.
pub fn seed(case: u64, rank: usize) -> u64 {
    case.wrapping_mul(0x1000_0000_01b3) ^ (rank as u64).wrapping_mul(0xff51_afd7_ed55_8ccd)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Class {
    Int {
        signed: bool,
    },
    /// An IEEE-style binary format: `exp` exponent bits, `man` mantissa bits. `e4m3fn` has no
    /// infinities and one NaN pattern per sign (`S.1111.111`), as NCCL's (and CUDA's) `__nv_fp8_e4m3`.
    Float {
        exp: u32,
        man: u32,
        e4m3fn: bool,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct Dtype {
    pub name: &'static str,
    pub nccl: ncclDataType_t,
    pub size: usize,
    pub class: Class,
}

const fn int(name: &'static str, nccl: ncclDataType_t, size: usize, signed: bool) -> Dtype {
    Dtype {
        name,
        nccl,
        size,
        class: Class::Int { signed },
    }
}

const fn float(name: &'static str, nccl: ncclDataType_t, size: usize, exp: u32, man: u32) -> Dtype {
    Dtype {
        name,
        nccl,
        size,
        class: Class::Float {
            exp,
            man,
            e4m3fn: exp == 4 && man == 3,
        },
    }
}

pub const INT8: Dtype = int("int8", ncclDataType_t::ncclInt8, 1, true);
pub const UINT8: Dtype = int("uint8", ncclDataType_t::ncclUint8, 1, false);
pub const INT32: Dtype = int("int32", ncclDataType_t::ncclInt32, 4, true);
pub const UINT32: Dtype = int("uint32", ncclDataType_t::ncclUint32, 4, false);
pub const INT64: Dtype = int("int64", ncclDataType_t::ncclInt64, 8, true);
pub const UINT64: Dtype = int("uint64", ncclDataType_t::ncclUint64, 8, false);
pub const FLOAT16: Dtype = float("float16", ncclDataType_t::ncclFloat16, 2, 5, 10);
pub const FLOAT32: Dtype = float("float32", ncclDataType_t::ncclFloat32, 4, 8, 23);
pub const FLOAT64: Dtype = float("float64", ncclDataType_t::ncclFloat64, 8, 11, 52);
pub const BFLOAT16: Dtype = float("bfloat16", ncclDataType_t::ncclBfloat16, 2, 8, 7);
pub const FLOAT8E4M3: Dtype = float("float8e4m3", ncclDataType_t::ncclFloat8e4m3, 1, 4, 3);
pub const FLOAT8E5M2: Dtype = float("float8e5m2", ncclDataType_t::ncclFloat8e5m2, 1, 5, 2);

/// Every data type nccl.h lists (its aliases, ncclChar, ncclInt, ncclHalf, ncclFloat, ncclDouble, are
/// the same values).
pub const ALL: [Dtype; 12] = [
    INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16, FLOAT8E4M3,
    FLOAT8E5M2,
];

// The table must cover every type the headers have.
const _: () = assert!(ALL.len() == ncclDataType_t::ncclNumTypes.0 as usize);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl Op {
    pub fn nccl(self) -> ncclRedOp_t {
        match self {
            Op::Sum => ncclRedOp_t::ncclSum,
            Op::Prod => ncclRedOp_t::ncclProd,
            Op::Max => ncclRedOp_t::ncclMax,
            Op::Min => ncclRedOp_t::ncclMin,
            Op::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

impl Dtype {
    pub fn is_float(&self) -> bool {
        matches!(self.class, Class::Float { .. })
    }

    /// The built-in ops the suite runs on this type: avg only for floating types.
    pub fn ops(&self) -> &'static [Op] {
        if self.is_float() {
            &[Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg]
        } else {
            &[Op::Sum, Op::Prod, Op::Max, Op::Min]
        }
    }

    fn bits(&self) -> u32 {
        self.size as u32 * 8
    }

    /// `count` random elements. Integers: any bit pattern. Floats: magnitudes in [0.5, 2), either sign,
    /// every mantissa pattern, so that sums and products of a few ranks neither overflow (fp8 e4m3's
    /// largest value is 448) nor lose everything to rounding, and no NaN or infinity appears.
    pub fn random(&self, rng: &mut Rng, count: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(count * self.size);
        for _ in 0..count {
            let r = rng.next_u64();
            let bits = match self.class {
                Class::Int { .. } => r,
                Class::Float { exp, man, .. } => {
                    let bias = (1u64 << (exp - 1)) - 1;
                    let e = bias - 1 + ((r >> 63) & 1); // 2^-1 or 2^0
                    let sign = (r >> 62) & 1;
                    let m = r & ((1u64 << man) - 1);
                    (sign << (exp + man)) | (e << man) | m
                }
            };
            out.extend_from_slice(&bits.to_le_bytes()[..self.size]);
        }
        out
    }

    /// Element `i`'s raw bits, zero-extended.
    #[inline]
    pub fn raw(&self, bytes: &[u8], i: usize) -> u64 {
        let s = &bytes[i * self.size..(i + 1) * self.size];
        match self.size {
            1 => s[0] as u64,
            2 => u16::from_le_bytes([s[0], s[1]]) as u64,
            4 => u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as u64,
            _ => u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]),
        }
    }

    /// Element `i` as a float (only for floating types).
    #[inline]
    pub fn value(&self, bytes: &[u8], i: usize) -> f64 {
        decode(self.class, self.raw(bytes, i))
    }

    /// Element `i` as a signed or unsigned integer, widened (only for integer types).
    fn int_value(&self, raw: u64) -> i128 {
        match self.class {
            Class::Int { signed: true } => {
                let shift = 64 - self.bits();
                (((raw << shift) as i64) >> shift) as i128
            }
            _ => raw as i128,
        }
    }

    /// Half of the gap between 1 and the next value: the relative error of one rounding.
    pub fn half_ulp(&self) -> f64 {
        match self.class {
            Class::Float { man, .. } => 2f64.powi(-(man as i32) - 1),
            Class::Int { .. } => 0.0,
        }
    }

    /// The smallest positive (subnormal) value: the absolute error of one rounding near zero.
    pub fn min_subnormal(&self) -> f64 {
        match self.class {
            Class::Float { exp, man, .. } => {
                let bias = (1i32 << (exp - 1)) - 1;
                2f64.powi(1 - bias - man as i32)
            }
            Class::Int { .. } => 0.0,
        }
    }

    /// The bits of `v` in this floating type, for values it represents exactly (scalars such as 1.5).
    pub fn encode_exact(&self, v: f64) -> Vec<u8> {
        let Class::Float { exp, man, .. } = self.class else {
            panic!("encode_exact is for floating types, not {}", self.name)
        };
        let bits = match self.size {
            8 => v.to_bits(),
            4 => (v as f32).to_bits() as u64,
            _ => {
                let bias = (1i64 << (exp - 1)) - 1;
                let (m, e) = frexp(v.abs());
                // v = m * 2^e with m in [0.5, 1): normal form 1.f * 2^(e-1).
                let biased = e - 1 + bias;
                assert!(
                    biased > 0 && biased < (1 << exp) - 1,
                    "{v} is not a normal {}",
                    self.name
                );
                let frac = (m * 2.0 - 1.0) * (1u64 << man) as f64;
                assert!(frac.fract() == 0.0, "{v} is not exact in {}", self.name);
                ((v.is_sign_negative() as u64) << (exp + man))
                    | ((biased as u64) << man)
                    | frac as u64
            }
        };
        let out = bits.to_le_bytes()[..self.size].to_vec();
        assert_eq!(self.value(&out, 0), v, "encode_exact({v}) in {}", self.name);
        out
    }
}

fn frexp(v: f64) -> (f64, i64) {
    assert!(v > 0.0 && v.is_finite());
    let e = v.log2().floor() as i64 + 1;
    let mut m = v / 2f64.powi(e as i32);
    let mut e = e;
    if m >= 1.0 {
        m /= 2.0;
        e += 1;
    }
    if m < 0.5 {
        m *= 2.0;
        e -= 1;
    }
    (m, e)
}

/// A floating value from its bits.
#[inline]
pub fn decode(class: Class, raw: u64) -> f64 {
    let Class::Float { exp, man, e4m3fn } = class else {
        return raw as f64;
    };
    match (exp, man) {
        (8, 23) => return f32::from_bits(raw as u32) as f64,
        (11, 52) => return f64::from_bits(raw),
        _ => {}
    }
    let sign = if (raw >> (exp + man)) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let e = ((raw >> man) & ((1 << exp) - 1)) as i32;
    let m = (raw & ((1 << man) - 1)) as f64;
    let bias = (1i32 << (exp - 1)) - 1;
    let max_e = (1i32 << exp) - 1;
    if e4m3fn {
        if e == max_e && m as u64 == (1 << man) - 1 {
            return f64::NAN;
        }
    } else if e == max_e {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    let scale = 2f64.powi(man as i32);
    if e == 0 {
        sign * m / scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m / scale) * 2f64.powi(e - bias)
    }
}

/// `|got - exact| <= tol`, false for a NaN.
fn within(got: f64, exact: f64, tol: f64) -> bool {
    matches!(
        (got - exact).abs().partial_cmp(&tol),
        Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
    )
}

/// Up to this many mismatches are described in a failure message.
const SHOWN: usize = 5;

struct Mismatches {
    count: usize,
    shown: Vec<String>,
}

impl Mismatches {
    fn new() -> Self {
        Mismatches {
            count: 0,
            shown: Vec::new(),
        }
    }

    fn add(&mut self, describe: impl FnOnce() -> String) {
        self.count += 1;
        if self.shown.len() < SHOWN {
            self.shown.push(describe());
        }
    }

    fn result(self, total: usize) -> Result<(), String> {
        if self.count == 0 {
            return Ok(());
        }
        Err(format!(
            "{} of {total} elements wrong; first: {}",
            self.count,
            self.shown.join("; ")
        ))
    }
}

/// `got` (`count` elements) against the reduction by `op` of `inputs` (one slice of `count` elements per
/// rank). Integers: exact, with the type's wrap-around. Floats: max/min exact; sum, prod and avg within
/// one rounding per rank (and one more) of the exact result, relative to the sum (product) of magnitudes.
pub fn check_reduce(dt: &Dtype, op: Op, inputs: &[&[u8]], got: &[u8]) -> Result<(), String> {
    let count = got.len() / dt.size;
    for (r, input) in inputs.iter().enumerate() {
        assert_eq!(input.len(), got.len(), "rank {r}'s input length");
    }
    let n = inputs.len();
    let mut bad = Mismatches::new();
    match dt.class {
        Class::Int { .. } => {
            let mask = if dt.size == 8 {
                u64::MAX
            } else {
                (1u64 << (dt.size * 8)) - 1
            };
            for i in 0..count {
                let mut acc = dt.raw(inputs[0], i);
                for input in &inputs[1..] {
                    let x = dt.raw(input, i);
                    acc = match op {
                        Op::Sum => acc.wrapping_add(x) & mask,
                        Op::Prod => acc.wrapping_mul(x) & mask,
                        Op::Max if dt.int_value(x) > dt.int_value(acc) => x,
                        Op::Min if dt.int_value(x) < dt.int_value(acc) => x,
                        Op::Max | Op::Min => acc,
                        Op::Avg => panic!("avg is not checked for integer types"),
                    };
                }
                let g = dt.raw(got, i);
                if g != acc {
                    bad.add(|| {
                        format!(
                            "[{i}] got {} expected {}",
                            dt.int_value(g),
                            dt.int_value(acc)
                        )
                    });
                }
            }
        }
        Class::Float { .. } => {
            let rounding = dt.half_ulp() * (n as f64 + 1.0);
            for i in 0..count {
                let x0 = dt.value(inputs[0], i);
                let (mut exact, mut scale) = (x0, x0.abs());
                for input in &inputs[1..] {
                    let x = dt.value(input, i);
                    match op {
                        Op::Sum | Op::Avg => {
                            exact += x;
                            scale += x.abs();
                        }
                        Op::Prod => {
                            exact *= x;
                            scale *= x.abs();
                        }
                        Op::Max => exact = exact.max(x),
                        Op::Min => exact = exact.min(x),
                    }
                }
                if op == Op::Avg {
                    exact /= n as f64;
                    scale /= n as f64;
                }
                let tol = match op {
                    Op::Max | Op::Min => 0.0,
                    _ => rounding * scale + dt.min_subnormal(),
                };
                let g = dt.value(got, i);
                if !within(g, exact, tol) {
                    bad.add(|| {
                        let xs: Vec<String> = inputs
                            .iter()
                            .map(|b| format!("{}", dt.value(b, i)))
                            .collect();
                        format!(
                            "[{i}] got {g} expected {exact} ±{tol:e} (inputs {})",
                            xs.join(", ")
                        )
                    });
                }
            }
        }
    }
    bad.result(count)
}

/// `got` against `Σ scalars[r] · inputs[r]` (ncclRedOpCreatePreMulSum): one rounding for each product and
/// each addition.
pub fn check_premul_sum(
    dt: &Dtype,
    scalars: &[f64],
    inputs: &[&[u8]],
    got: &[u8],
) -> Result<(), String> {
    let count = got.len() / dt.size;
    let rounding = dt.half_ulp() * (2.0 * inputs.len() as f64 + 1.0);
    let mut bad = Mismatches::new();
    for i in 0..count {
        let (mut exact, mut scale) = (0.0, 0.0);
        for (s, input) in scalars.iter().zip(inputs) {
            let term = s * dt.value(input, i);
            exact += term;
            scale += term.abs();
        }
        let tol = rounding * scale + dt.min_subnormal();
        let g = dt.value(got, i);
        if !within(g, exact, tol) {
            bad.add(|| format!("[{i}] got {g} expected {exact} ±{tol:e}"));
        }
    }
    bad.result(count)
}

/// `got` byte for byte against `expected` (data movement: gathers, broadcasts, sends).
pub fn check_equal(dt: &Dtype, expected: &[u8], got: &[u8]) -> Result<(), String> {
    assert_eq!(expected.len(), got.len(), "lengths");
    if expected == got {
        return Ok(());
    }
    let count = got.len() / dt.size;
    let mut bad = Mismatches::new();
    for i in 0..count {
        let (e, g) = (dt.raw(expected, i), dt.raw(got, i));
        if e != g {
            bad.add(|| format!("[{i}] got {g:#x} expected {e:#x}"));
        }
    }
    bad.result(count)
}

#[cfg(test)]
mod host_checks {
    //! The host side alone, on any machine: the decoders and checks the GPU tests rely on.
    use super::*;

    #[test]
    fn decoders_know_the_formats() {
        assert_eq!(decode(FLOAT16.class, 0x3c00), 1.0);
        assert_eq!(decode(FLOAT16.class, 0xc000), -2.0);
        assert_eq!(decode(FLOAT16.class, 0x7bff), 65504.0);
        assert_eq!(decode(FLOAT16.class, 0x0001), 2f64.powi(-24));
        assert!(decode(FLOAT16.class, 0x7c00).is_infinite());
        assert_eq!(decode(BFLOAT16.class, 0x3f80), 1.0);
        assert_eq!(decode(BFLOAT16.class, 0x4049), 3.140625);
        assert_eq!(decode(FLOAT8E4M3.class, 0x38), 1.0);
        assert_eq!(decode(FLOAT8E4M3.class, 0x7e), 448.0);
        assert!(decode(FLOAT8E4M3.class, 0x7f).is_nan());
        assert_eq!(decode(FLOAT8E4M3.class, 0x01), 2f64.powi(-9));
        assert_eq!(decode(FLOAT8E5M2.class, 0x3c), 1.0);
        assert_eq!(decode(FLOAT8E5M2.class, 0x7b), 57344.0);
        assert!(decode(FLOAT8E5M2.class, 0x7c).is_infinite());
        assert_eq!(decode(FLOAT32.class, 1.5f32.to_bits() as u64), 1.5);
    }

    #[test]
    fn random_floats_stay_in_range() {
        let mut rng = Rng::new(1);
        for dt in ALL.iter().filter(|d| d.is_float()) {
            let data = dt.random(&mut rng, 4096);
            for i in 0..4096 {
                let v = dt.value(&data, i).abs();
                assert!((0.5..2.0).contains(&v), "{}: {v}", dt.name);
            }
        }
    }

    #[test]
    fn exact_encoding_round_trips() {
        for dt in [FLOAT16, BFLOAT16, FLOAT32, FLOAT64, FLOAT8E4M3, FLOAT8E5M2] {
            for v in [1.5, -0.75, 2.0, 0.25] {
                assert_eq!(dt.value(&dt.encode_exact(v), 0), v, "{}", dt.name);
            }
        }
    }

    #[test]
    fn reduce_check_accepts_right_and_rejects_wrong() {
        let mut rng = Rng::new(7);
        for dt in ALL {
            for &op in dt.ops() {
                let a = dt.random(&mut rng, 64);
                let b = dt.random(&mut rng, 64);
                // A wrong answer: rank 0's input alone.
                let wrong = check_reduce(&dt, op, &[&a, &b], &a);
                let right = host_reduce(&dt, op, &[&a, &b]);
                check_reduce(&dt, op, &[&a, &b], &right)
                    .unwrap_or_else(|e| panic!("{} {op:?}: {e}", dt.name));
                if !matches!(op, Op::Max | Op::Min) {
                    assert!(wrong.is_err(), "{} {op:?} accepted a wrong result", dt.name);
                }
                let poison = vec![0xffu8; a.len()];
                if dt.is_float() {
                    assert!(check_reduce(&dt, op, &[&a, &b], &poison).is_err());
                }
            }
        }
    }

    /// The reduction computed on the host and rounded to the nearest value of the type, by search
    /// (slow: for tests of the checker only).
    fn host_reduce(dt: &Dtype, op: Op, inputs: &[&[u8]]) -> Vec<u8> {
        let count = inputs[0].len() / dt.size;
        let mut out = Vec::new();
        for i in 0..count {
            if !dt.is_float() {
                let mask = if dt.size == 8 {
                    u64::MAX
                } else {
                    (1u64 << (dt.size * 8)) - 1
                };
                let mut acc = dt.raw(inputs[0], i);
                for input in &inputs[1..] {
                    let x = dt.raw(input, i);
                    acc = match op {
                        Op::Sum => acc.wrapping_add(x) & mask,
                        Op::Prod => acc.wrapping_mul(x) & mask,
                        Op::Max => {
                            if dt.int_value(x) > dt.int_value(acc) {
                                x
                            } else {
                                acc
                            }
                        }
                        Op::Min => {
                            if dt.int_value(x) < dt.int_value(acc) {
                                x
                            } else {
                                acc
                            }
                        }
                        Op::Avg => unreachable!(),
                    };
                }
                out.extend_from_slice(&acc.to_le_bytes()[..dt.size]);
                continue;
            }
            let xs: Vec<f64> = inputs.iter().map(|b| dt.value(b, i)).collect();
            let exact = match op {
                Op::Sum => xs.iter().sum(),
                Op::Avg => xs.iter().sum::<f64>() / xs.len() as f64,
                Op::Prod => xs.iter().product(),
                Op::Max => xs.iter().cloned().fold(f64::MIN, f64::max),
                Op::Min => xs.iter().cloned().fold(f64::MAX, f64::min),
            };
            let bits = match dt.size {
                8 => exact.to_bits(),
                4 => (exact as f32).to_bits() as u64,
                _ => (0..1u64 << (dt.size * 8))
                    .filter(|&b| decode(dt.class, b).is_finite())
                    .min_by(|&a, &b| {
                        let da = (decode(dt.class, a) - exact).abs();
                        let db = (decode(dt.class, b) - exact).abs();
                        da.partial_cmp(&db).expect("finite")
                    })
                    .expect("some value"),
            };
            out.extend_from_slice(&bits.to_le_bytes()[..dt.size]);
        }
        out
    }
}
