//! What each collective moves: element counts as nccl-tests computes them (its `getCollByteCount`), the
//! bandwidth formulas of its doc/PERFORMANCE.md, and which outputs the check compares with what.

use crate::args::Coll;

/// Element counts of one size, as nccl-tests' `setupArgs` derives them.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    /// Elements each rank sends.
    pub send: usize,
    /// Elements each rank receives.
    pub recv: usize,
    /// The count passed to NCCL (and printed in the `count` column).
    pub param: usize,
    /// In place, the send buffer is `recv + send_inplace * rank` elements.
    pub send_inplace: usize,
    /// In place, the receive buffer is `recv + recv_inplace * rank` elements.
    pub recv_inplace: usize,
}

/// Counts for `bytes` of `elem`-byte elements on `n` ranks. Per-rank blocks (gather, scatter, all-to-all)
/// are rounded down to 16 bytes, as nccl-tests does.
pub fn counts(coll: Coll, bytes: usize, elem: usize, n: usize) -> Counts {
    let count = bytes / elem;
    let align = (16 / elem).max(1);
    let block = (count / n) / align * align;
    let plain = Counts {
        send: count,
        recv: count,
        param: count,
        send_inplace: 0,
        recv_inplace: 0,
    };
    match coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => plain,
        Coll::AllGather => Counts {
            send: block,
            recv: block * n,
            param: block,
            send_inplace: block,
            recv_inplace: 0,
        },
        Coll::ReduceScatter => Counts {
            send: block * n,
            recv: block,
            param: block,
            send_inplace: 0,
            recv_inplace: block,
        },
        Coll::AllToAll => Counts {
            send: block * n,
            recv: block * n,
            param: block,
            send_inplace: 0,
            recv_inplace: 0,
        },
    }
}

/// (algbw, busbw) in GB/s for `seconds` per iteration (nccl-tests' doc/PERFORMANCE.md).
pub fn bandwidths(coll: Coll, c: &Counts, elem: usize, n: usize, seconds: f64) -> (f64, f64) {
    let nf = n as f64;
    let bytes = match coll {
        Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => c.param * elem * n,
        _ => c.param * elem,
    } as f64;
    let algbw = if seconds > 0.0 {
        bytes / 1.0e9 / seconds
    } else {
        0.0
    };
    let factor = match coll {
        Coll::AllReduce => 2.0 * (nf - 1.0) / nf,
        Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (nf - 1.0) / nf,
        Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
    };
    (algbw, algbw * factor)
}

/// A stretch of a rank's output and what it must hold: a copy of rank `source`'s input (`Some`), or the
/// reduction over all ranks (`None`), starting at element `start` of that pattern.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub offset: usize,
    pub len: usize,
    pub source: Option<usize>,
    pub start: usize,
}

/// The stretches of rank `rank`'s output (relative to the receive pointer the collective was given).
pub fn segments(coll: Coll, c: &Counts, rank: usize, n: usize, root: usize) -> Vec<Segment> {
    let p = c.param;
    let whole = |source, start| {
        vec![Segment {
            offset: 0,
            len: p,
            source,
            start,
        }]
    };
    match coll {
        Coll::AllReduce => whole(None, 0),
        Coll::ReduceScatter => whole(None, rank * p),
        Coll::Reduce if rank == root => whole(None, 0),
        Coll::Reduce => Vec::new(),
        Coll::Broadcast => whole(Some(root), 0),
        Coll::SendRecv => whole(Some((rank + n - 1) % n), 0),
        Coll::AllGather => (0..n)
            .map(|b| Segment {
                offset: b * p,
                len: p,
                source: Some(b),
                start: 0,
            })
            .collect(),
        Coll::AllToAll => (0..n)
            .map(|b| Segment {
                offset: b * p,
                len: p,
                source: Some(b),
                start: rank * p,
            })
            .collect(),
    }
}
