//! Command-line options, as nccl-tests spells them (`-b 8 -e 4G -f 4 -g 2 -w 5 -n 20 -c 1 -d float -o sum
//! -r 0 -G 0 -R 0`), plus the collective's name and `--helpers`. Parsed by hand: the benchmark has no
//! dependencies besides the crate.

use std::fmt;

pub use metrale_gpu_testkit::op::Op;

/// The collectives, by the names nccl-tests gives their binaries (without `_perf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// Whether the collective takes a reduction operation (otherwise nccl-tests prints `none`).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether it has a root (otherwise nccl-tests prints `-1`).
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// In place, send and receive buffers overlap with no defined result: timed, but `#wrong` is `N/A`.
    pub fn in_place_unchecked(self) -> bool {
        matches!(self, Coll::AllToAll | Coll::SendRecv)
    }
}

/// The data types, with nccl-tests' names (fp8 types are not offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Half,
    Float,
    Double,
    Bfloat16,
}

impl DType {
    pub const ALL: [DType; 10] = [
        DType::Int8,
        DType::Uint8,
        DType::Int32,
        DType::Uint32,
        DType::Int64,
        DType::Uint64,
        DType::Half,
        DType::Float,
        DType::Double,
        DType::Bfloat16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::Int8 => "int8",
            DType::Uint8 => "uint8",
            DType::Int32 => "int32",
            DType::Uint32 => "uint32",
            DType::Int64 => "int64",
            DType::Uint64 => "uint64",
            DType::Half => "half",
            DType::Float => "float",
            DType::Double => "double",
            DType::Bfloat16 => "bfloat16",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::Int8 | DType::Uint8 => 1,
            DType::Half | DType::Bfloat16 => 2,
            DType::Int32 | DType::Uint32 | DType::Float => 4,
            DType::Int64 | DType::Uint64 | DType::Double => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Half | DType::Float | DType::Double | DType::Bfloat16
        )
    }
}

/// `-R`: nccl-tests' buffer registration levels (see `register.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Register {
    /// `-R 0`: `ncclMemAlloc` buffers, not registered.
    Off,
    /// `-R 1`: registered with `ncclCommRegister`.
    Local,
    /// `-R 2`: symmetric windows, `ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)`.
    Symmetric,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub coll: Coll,
    pub min_bytes: usize,
    pub max_bytes: usize,
    /// Multiply the size by this each step; 1 means add `step_bytes` instead (as nccl-tests does).
    pub step_factor: usize,
    pub step_bytes: usize,
    pub gpus: usize,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
    pub dtype: DType,
    pub op: Op,
    pub root: usize,
    /// CUDA graph launches per measurement (`-G`); 0 runs the iterations eagerly.
    pub graph_launches: usize,
    /// `-R`: how the buffers are registered.
    pub register: Register,
    /// `--helpers`: the helper micro-benchmark instead of a collective.
    pub helpers: bool,
    pub helper_calls: usize,
    pub helper_reps: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            coll: Coll::AllReduce,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 1,
            step_bytes: 1 << 20,
            gpus: 1,
            warmup: 5,
            iters: 20,
            check: true,
            dtype: DType::Float,
            op: Op::Sum,
            root: 0,
            graph_launches: 0,
            register: Register::Off,
            helpers: false,
            helper_calls: 100_000,
            helper_reps: 11,
        }
    }
}

/// What the command line asks for.
pub enum Command {
    Help,
    Run(Options),
}

/// A usage error, printed with a pointer to `--help`.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub fn usage(program: &str) -> String {
    let colls = Coll::ALL.map(Coll::name).join(", ");
    let types = DType::ALL.map(DType::name).join(", ");
    let ops = Op::ALL.map(Op::name).join(", ");
    format!(
        "\
NCCL collective benchmark through metrale-gpu-sys, in nccl-tests' format (one process driving -g GPUs).

Usage: {program} [COLLECTIVE] [OPTIONS]
       {program} --helpers [--calls N] [--reps N]

COLLECTIVE: {colls} (default all_reduce)

Options (as nccl-tests; sizes take K, M, G suffixes, powers of 1024):
  -b, --minbytes SIZE        smallest size (default 32M)
  -e, --maxbytes SIZE        largest size (default 32M)
  -f, --stepfactor N         multiply the size by N each step (default 1: add --stepbytes)
  -i, --stepbytes SIZE       add SIZE each step when the factor is 1 (default 1M)
  -g, --ngpus N              GPUs driven by this process, devices 0..N-1 (default 1)
  -w, --warmup_iters N       untimed iterations before each measurement (default 5)
  -n, --iters N              timed iterations per measurement (default 20)
  -c, --check 0|1            check the results: the #wrong column (default 1)
  -d, --datatype TYPE        {types} (default float)
  -o, --op OP                {ops} (default sum)
  -r, --root N               root rank of broadcast and reduce (default 0)
  -G, --cudagraph N          capture the -n iterations in a CUDA graph per GPU and time N launches of it
                             (default 0: eager)
  -R, --local_register 0|1|2 the buffers (always from ncclMemAlloc, as nccl-tests allocates them): 0 not
                             registered, 1 ncclCommRegister, 2 symmetric windows (ncclCommWindowRegister
                             with NCCL_WIN_COLL_SYMMETRIC); as nccl-tests' -R (default 0)
      --helpers              instead: ns per call of the crate's helpers (stream_ready, record_event,
                             stream_wait_event, check_nccl, an empty ncclGroupStart/End) on GPU 0
      --calls N              calls per repetition of --helpers (default 100000)
      --reps N               repetitions of --helpers, the median is reported (default 11)
  -h, --help                 this text

Every size is measured out of place and in place. Times come from CUDA events recorded on each GPU's
stream around the iterations (no host synchronisation inside), the slowest GPU's; busbw follows
nccl-tests' doc/PERFORMANCE.md. With --check 1, after each measurement the inputs are re-filled with a
known pattern, the collective runs once more, and every output element is compared with the value
computed on the host. Exit status: 0 when all is well, 1 on an error or a wrong element."
    )
}

/// Parses a size like nccl-tests: a number with an optional K, M or G suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, UsageError> {
    let bad = || {
        UsageError(format!(
            "not a size: '{text}' (expected e.g. 8, 64K, 128M, 4G)"
        ))
    };
    let (digits, shift) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: usize = digits.parse().map_err(|_| bad())?;
    value.checked_mul(1usize << shift).ok_or_else(bad)
}

fn parse_count(name: &str, text: &str) -> Result<usize, UsageError> {
    text.parse()
        .map_err(|_| UsageError(format!("{name}: not a count: '{text}'")))
}

fn parse_register(text: &str) -> Result<Register, UsageError> {
    match text {
        "0" => Ok(Register::Off),
        "1" => Ok(Register::Local),
        "2" => Ok(Register::Symmetric),
        _ => Err(UsageError(format!(
            "-R: '{text}' is not 0 (not registered), 1 (ncclCommRegister) or 2 (symmetric windows)"
        ))),
    }
}

fn lookup<T: Copy>(
    what: &str,
    text: &str,
    all: &[T],
    name: impl Fn(T) -> &'static str,
) -> Result<T, UsageError> {
    all.iter()
        .copied()
        .find(|&v| name(v) == text)
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|&v| name(v)).collect();
            UsageError(format!(
                "unknown {what} '{text}' (expected one of: {})",
                names.join(", ")
            ))
        })
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, UsageError> {
    let mut o = Options::default();
    let mut coll_given = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        // Split `--name=value`, `-xVALUE`, or take the next argument as the value.
        let (key, inline): (&str, Option<&str>) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (long, None),
            }
        } else if arg.len() > 2
            && arg.starts_with('-')
            && !arg[1..].starts_with(|c: char| c.is_ascii_digit())
        {
            (&arg[1..2], Some(&arg[2..]))
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            (short, None)
        } else {
            let coll = lookup("collective", arg, &Coll::ALL, Coll::name)?;
            if coll_given {
                return Err(UsageError(format!("a second collective: '{arg}'")));
            }
            coll_given = true;
            o.coll = coll;
            continue;
        };
        match key {
            "h" | "help" => return Ok(Command::Help),
            "helpers" => {
                o.helpers = true;
                continue;
            }
            _ => {}
        }
        let value = match inline {
            Some(v) => v.to_string(),
            None => {
                let v = args
                    .get(i)
                    .ok_or_else(|| UsageError(format!("option '{arg}' needs a value")))?;
                i += 1;
                v.clone()
            }
        };
        match key {
            "b" | "minbytes" => o.min_bytes = parse_size(&value)?,
            "e" | "maxbytes" => o.max_bytes = parse_size(&value)?,
            "f" | "stepfactor" => o.step_factor = parse_count(arg, &value)?,
            "i" | "stepbytes" => o.step_bytes = parse_size(&value)?,
            "g" | "ngpus" => o.gpus = parse_count(arg, &value)?,
            "w" | "warmup_iters" => o.warmup = parse_count(arg, &value)?,
            "n" | "iters" => o.iters = parse_count(arg, &value)?,
            "c" | "check" => o.check = parse_count(arg, &value)? != 0,
            "d" | "datatype" => o.dtype = lookup("data type", &value, &DType::ALL, DType::name)?,
            "o" | "op" => o.op = lookup("reduction op", &value, &Op::ALL, Op::name)?,
            "r" | "root" => o.root = parse_count(arg, &value)?,
            "G" | "cudagraph" => o.graph_launches = parse_count(arg, &value)?,
            "R" | "local_register" => o.register = parse_register(&value)?,
            "calls" => o.helper_calls = parse_count(arg, &value)?,
            "reps" => o.helper_reps = parse_count(arg, &value)?,
            _ => return Err(UsageError(format!("unknown option '{arg}'"))),
        }
    }
    validate(&o)?;
    Ok(Command::Run(o))
}

fn validate(o: &Options) -> Result<(), UsageError> {
    let fail = |m: &str| Err(UsageError(m.to_string()));
    if o.gpus == 0 {
        return fail("-g: at least one GPU");
    }
    if o.iters == 0 {
        return fail("-n: at least one timed iteration");
    }
    if o.min_bytes > o.max_bytes {
        return fail("-b is larger than -e");
    }
    if o.step_factor == 0 || (o.step_factor == 1 && o.step_bytes == 0) {
        return fail("-f 0, or -f 1 with -i 0: the sweep would never end");
    }
    if o.root >= o.gpus {
        return fail("-r: the root must be one of the -g ranks");
    }
    if o.helpers && (o.helper_calls == 0 || o.helper_reps == 0) {
        return fail("--calls and --reps must be at least 1");
    }
    Ok(())
}

/// The sizes of the sweep, as nccl-tests steps them.
pub fn sizes(o: &Options) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = o.min_bytes;
    while size <= o.max_bytes {
        sizes.push(size);
        let next = if o.step_factor > 1 {
            size.saturating_mul(o.step_factor)
        } else {
            size.saturating_add(o.step_bytes)
        };
        if next == size {
            break;
        }
        size = next;
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Result<Options, UsageError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&args)? {
            Command::Run(o) => Ok(o),
            Command::Help => Err(UsageError("help".into())),
        }
    }

    #[test]
    fn register_takes_nccl_tests_spellings() {
        assert_eq!(options(&[]).expect("defaults").register, Register::Off);
        let o = options(&["all_reduce", "-R", "2", "-G", "20"]).expect("-R 2 -G 20");
        assert_eq!((o.register, o.graph_launches), (Register::Symmetric, 20));
        assert_eq!(options(&["-R1"]).expect("-R1").register, Register::Local);
        let o = options(&["--local_register=0"]).expect("long form");
        assert_eq!(o.register, Register::Off);
    }

    #[test]
    fn register_refuses_other_levels() {
        for bad in ["3", "-1", "sym", ""] {
            let e = options(&["-R", bad]).expect_err(bad);
            assert!(e.0.contains("-R"), "{bad}: {e}");
        }
    }
}
