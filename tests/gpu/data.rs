//! Host-side data: a seeded generator, NCCL's data types as the host sees them (fp16, bf16 and both fp8
//! formats through the testkit's codecs), and the checks that compare what a GPU produced with what the
//! host computes.

use metrale_gpu_sys::nccl::ncclDataType_t;
use metrale_gpu_testkit::codec::{self, Format};
use metrale_gpu_testkit::op::Op;

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
    F32,
    F64,
    /// fp16, bf16, fp8: decoded and encoded by the testkit's codec.
    Narrow(Format),
}

#[derive(Clone, Copy, Debug)]
pub struct Dtype {
    pub name: &'static str,
    pub nccl: ncclDataType_t,
    pub size: usize,
    pub class: Class,
}

const fn dtype(name: &'static str, nccl: ncclDataType_t, size: usize, class: Class) -> Dtype {
    Dtype {
        name,
        nccl,
        size,
        class,
    }
}

const fn int(name: &'static str, nccl: ncclDataType_t, size: usize, signed: bool) -> Dtype {
    dtype(name, nccl, size, Class::Int { signed })
}

pub const INT8: Dtype = int("int8", ncclDataType_t::ncclInt8, 1, true);
pub const UINT8: Dtype = int("uint8", ncclDataType_t::ncclUint8, 1, false);
pub const INT32: Dtype = int("int32", ncclDataType_t::ncclInt32, 4, true);
pub const UINT32: Dtype = int("uint32", ncclDataType_t::ncclUint32, 4, false);
pub const INT64: Dtype = int("int64", ncclDataType_t::ncclInt64, 8, true);
pub const UINT64: Dtype = int("uint64", ncclDataType_t::ncclUint64, 8, false);
pub const FLOAT16: Dtype = dtype(
    "float16",
    ncclDataType_t::ncclFloat16,
    2,
    Class::Narrow(codec::FP16),
);
pub const FLOAT32: Dtype = dtype("float32", ncclDataType_t::ncclFloat32, 4, Class::F32);
pub const FLOAT64: Dtype = dtype("float64", ncclDataType_t::ncclFloat64, 8, Class::F64);
pub const BFLOAT16: Dtype = dtype(
    "bfloat16",
    ncclDataType_t::ncclBfloat16,
    2,
    Class::Narrow(codec::BF16),
);
pub const FLOAT8E4M3: Dtype = dtype(
    "float8e4m3",
    ncclDataType_t::ncclFloat8e4m3,
    1,
    Class::Narrow(codec::FP8_E4M3),
);
pub const FLOAT8E5M2: Dtype = dtype(
    "float8e5m2",
    ncclDataType_t::ncclFloat8e5m2,
    1,
    Class::Narrow(codec::FP8_E5M2),
);

/// Every data type nccl.h lists (its aliases, ncclChar, ncclInt, ncclHalf, ncclFloat, ncclDouble, are
/// the same values).
pub const ALL: [Dtype; 12] = [
    INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16, FLOAT8E4M3,
    FLOAT8E5M2,
];

// The table must cover every type the headers have.
const _: () = assert!(ALL.len() == ncclDataType_t::ncclNumTypes.0 as usize);

impl Dtype {
    pub fn is_float(&self) -> bool {
        !matches!(self.class, Class::Int { .. })
    }

    /// The built-in ops the suite runs on this type: avg only for floating types.
    pub fn ops(&self) -> &'static [Op] {
        if self.is_float() {
            &Op::ALL
        } else {
            &[Op::Sum, Op::Prod, Op::Max, Op::Min]
        }
    }

    /// Exponent and mantissa bits of a floating type.
    fn float_layout(&self) -> Option<(u32, u32)> {
        match self.class {
            Class::Int { .. } => None,
            Class::F32 => Some((8, 23)),
            Class::F64 => Some((11, 52)),
            Class::Narrow(f) => Some((f.exp, f.man)),
        }
    }

    /// `count` random elements. Integers: any bit pattern. Floats: magnitudes in [0.5, 2), either sign,
    /// every mantissa pattern, so that sums and products of a few ranks neither overflow (fp8 e4m3's
    /// largest value is 448) nor lose everything to rounding, and no NaN or infinity appears.
    pub fn random(&self, rng: &mut Rng, count: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(count * self.size);
        for _ in 0..count {
            let r = rng.next_u64();
            let bits = match self.float_layout() {
                None => r,
                Some((exp, man)) => {
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
        let mut b = [0u8; 8];
        b[..self.size].copy_from_slice(&bytes[i * self.size..(i + 1) * self.size]);
        u64::from_le_bytes(b)
    }

    /// A floating value from its bits (integers: the bits as a number).
    #[inline]
    pub fn decode(&self, raw: u64) -> f64 {
        match self.class {
            Class::Int { .. } => raw as f64,
            Class::F32 => f64::from(f32::from_bits(raw as u32)),
            Class::F64 => f64::from_bits(raw),
            Class::Narrow(f) => f.decode(raw as u16),
        }
    }

    /// Element `i` as a float (only for floating types).
    #[inline]
    pub fn value(&self, bytes: &[u8], i: usize) -> f64 {
        self.decode(self.raw(bytes, i))
    }

    /// `v` rounded to this floating type, to nearest even.
    pub fn encode(&self, v: f64) -> Vec<u8> {
        let bits = match self.class {
            Class::Int { .. } => panic!("encode is for floating types, not {}", self.name),
            Class::F32 => u64::from((v as f32).to_bits()),
            Class::F64 => v.to_bits(),
            Class::Narrow(f) => u64::from(f.encode(v)),
        };
        bits.to_le_bytes()[..self.size].to_vec()
    }

    /// The bits of `v` in this floating type, for values it represents exactly (scalars such as 1.5).
    pub fn encode_exact(&self, v: f64) -> Vec<u8> {
        let out = self.encode(v);
        assert_eq!(self.value(&out, 0), v, "{v} is not exact in {}", self.name);
        out
    }

    /// The integer reduction, as the GPU computes it in this type.
    fn reduce_int(&self, op: Op, raws: &[u64]) -> u64 {
        let Class::Int { signed } = self.class else {
            panic!("{} is not an integer type", self.name)
        };
        op.reduce_int(raws, self.size as u32 * 8, signed)
            .unwrap_or_else(|| panic!("{op:?} is not checked for integer types"))
    }

    /// A raw integer, sign-extended where the type is signed (for messages).
    fn int_value(&self, raw: u64) -> i128 {
        match self.class {
            Class::Int { signed: true } => {
                let shift = 64 - self.size as u32 * 8;
                i128::from(((raw << shift) as i64) >> shift)
            }
            _ => i128::from(raw),
        }
    }

    /// Half of the gap between 1 and the next value: the relative error of one rounding.
    pub fn half_ulp(&self) -> f64 {
        self.float_layout()
            .map_or(0.0, |(_, man)| 2f64.powi(-(man as i32) - 1))
    }

    /// The smallest positive (subnormal) value: the absolute error of one rounding near zero.
    pub fn min_subnormal(&self) -> f64 {
        self.float_layout().map_or(0.0, |(exp, man)| {
            let bias = (1i32 << (exp - 1)) - 1;
            2f64.powi(1 - bias - man as i32)
        })
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
    let rounding = dt.half_ulp() * (n as f64 + 1.0);
    let mut bad = Mismatches::new();
    // Reused for every element: the suite checks hundreds of millions of them.
    let (mut raws, mut xs, mut magnitudes) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..count {
        if !dt.is_float() {
            raws.clear();
            raws.extend(inputs.iter().map(|b| dt.raw(b, i)));
            let (want, g) = (dt.reduce_int(op, &raws), dt.raw(got, i));
            if g != want {
                bad.add(|| {
                    format!(
                        "[{i}] got {} expected {}",
                        dt.int_value(g),
                        dt.int_value(want)
                    )
                });
            }
            continue;
        }
        xs.clear();
        xs.extend(inputs.iter().map(|b| dt.value(b, i)));
        let exact = op.reduce_f64(&xs);
        let tol = match op {
            Op::Max | Op::Min => 0.0,
            _ => {
                magnitudes.clear();
                magnitudes.extend(xs.iter().map(|x| x.abs()));
                rounding * op.reduce_f64(&magnitudes) + dt.min_subnormal()
            }
        };
        let g = dt.value(got, i);
        if !within(g, exact, tol) {
            bad.add(|| format!("[{i}] got {g} expected {exact} ±{tol:e} (inputs {xs:?})"));
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
    //! The host side alone, on any machine: the checks the GPU tests rely on.
    use super::*;

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
        for dt in ALL.iter().filter(|d| d.is_float()) {
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
                let right = host_reduce(&dt, op, &[&a, &b]);
                check_reduce(&dt, op, &[&a, &b], &right)
                    .unwrap_or_else(|e| panic!("{} {op:?}: {e}", dt.name));
                // A wrong answer: rank 0's input alone (max and min may legitimately equal it).
                if !matches!(op, Op::Max | Op::Min) {
                    let wrong = check_reduce(&dt, op, &[&a, &b], &a);
                    assert!(wrong.is_err(), "{} {op:?} accepted a wrong result", dt.name);
                }
                if dt.is_float() {
                    let poison = vec![0xffu8; a.len()];
                    assert!(check_reduce(&dt, op, &[&a, &b], &poison).is_err());
                }
            }
        }
    }

    /// The reduction computed on the host, rounded once to the type (a correct GPU's result is within
    /// the checker's tolerance of it, so the checker must accept it).
    fn host_reduce(dt: &Dtype, op: Op, inputs: &[&[u8]]) -> Vec<u8> {
        let count = inputs[0].len() / dt.size;
        (0..count)
            .flat_map(|i| {
                if dt.is_float() {
                    let xs: Vec<f64> = inputs.iter().map(|b| dt.value(b, i)).collect();
                    dt.encode(op.reduce_f64(&xs))
                } else {
                    let raws: Vec<u64> = inputs.iter().map(|b| dt.raw(b, i)).collect();
                    dt.reduce_int(op, &raws).to_le_bytes()[..dt.size].to_vec()
                }
            })
            .collect()
    }
}
