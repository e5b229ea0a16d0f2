//! The rendezvous's messages: one line of text each, what they mean, how they are written and read.
//!
//! Every communicator the ranks make is a generation, numbered from 0 (the first world); each recovery
//! and each grow makes the next one. Member to coordinator:
//! - `HELLO <rank>`: a rank of the first world; `JOIN`: a replacement, waiting for the next grow (each
//!   the hello of the launch crate's exchange, `metrale_gpu_launch::auth`: on the wire it ends in its
//!   proof of the job token, which rank 0's door checks and strips before this parser sees the line);
//! - `LOST <gen> revoked|aborted`: this rank gave up on generation `gen` and holds it revoked (it can be
//!   shrunk) or aborted (it cannot: NCCL reported an error, or the revoke did not end cleanly);
//! - `READY <gen>`: this rank has the `GROW` to generation `gen` (its connection's thread answers at
//!   once, so it holds the order before it can finish the round the grow follows);
//! - `DONE`: this rank finished its last round; the end of its connection is no death;
//! - `BEAT`: this process is alive, every [`BEAT_EVERY`] from a thread of its own (whatever its
//!   training does): rank 0 treats a member silent for [`SILENCE`] as dead (a frozen process's
//!   connection stays open, and says nothing);
//!
//! Coordinator to member:
//! - `ID <hex>`: the first unique id (the answer to `HELLO`);
//! - `RECOVER <gen> <why>`: generation `gen` is lost: give up on it and say how you hold it;
//! - `SHRINK <gen> <rank> <size> <step> <r>,<r>…`: the plan: shrink the lost generation without those
//!   ranks, becoming `rank` of `size` in generation `gen`, and train on from round `step`;
//! - `INIT <gen> <rank> <size> <step> <hex>`: the plan: make generation `gen` from this new unique id;
//! - `GROW <gen> <size> <after>` (a member) and `GROWID <gen> <rank> <size> <after> <hex>` (a
//!   replacement): after round `after`, grow to `size` ranks, generation `gen`, and train on from round
//!   `after + 1`;
//! - `EXCLUDED <why>`: this rank did not report in time and was left out (its connection then closes);
//! - `END <why>`: the job cannot go on (fewer survivors than `--min-size`) or is over (to a replacement
//!   still waiting): every rank that gets it ends with `why`.

use std::fmt;
use std::time::Duration;

/// How often a member says `BEAT`.
pub const BEAT_EVERY: Duration = Duration::from_millis(250);
/// How long rank 0 hears nothing from a member (no `BEAT`, no other line) before it treats it as dead:
/// six beats missed in a row. A slow process still beats (its beat has a thread of its own); a frozen
/// one (SIGSTOP, a host that hangs) does not.
pub const SILENCE: Duration = Duration::from_millis(1500);
/// How often rank 0 looks for members silent past [`SILENCE`]: a frozen member is dead within
/// `SILENCE + BEAT_CHECK` (1.75 s) of its last line.
pub const BEAT_CHECK: Duration = Duration::from_millis(250);

/// The longest line either side reads (`metrale_gpu_launch::line`): far above the longest message (a recovery's
/// reason with its ranks listed), far below memory.
pub const LINE_CAP: usize = 64 * 1024;

/// How a rank holds the communicator it gave up on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Revoked and quiescent with no error: it can be shrunk.
    Revoked,
    /// Aborted: only a new communicator (a new unique id) can replace it.
    Aborted,
}

impl Held {
    /// Its word on the wire: `revoked` or `aborted`.
    pub fn word(self) -> &'static str {
        match self {
            Held::Revoked => "revoked",
            Held::Aborted => "aborted",
        }
    }

    /// The `Held` of a word [`Held::word`] wrote.
    pub fn from_word(word: &str) -> Option<Held> {
        [Held::Revoked, Held::Aborted]
            .into_iter()
            .find(|h| h.word() == word)
    }
}

/// How the next generation is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum How {
    /// `ncclCommShrink` of the lost generation without these ranks (its ranks).
    Shrink { exclude: Vec<usize> },
    /// `ncclCommInitRankConfig` from this unique id (hex).
    Init { id: String },
}

/// What every survivor of a lost generation does next, and who it will be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub gen: u64,
    pub rank: usize,
    pub size: usize,
    /// The round every survivor trains on from (rank 0's: a round some rank did not finish is redone).
    pub step: usize,
    pub how: How,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello {
        rank: usize,
    },
    Join,
    Lost {
        gen: u64,
        held: Held,
    },
    Ready {
        gen: u64,
    },
    Done,
    Beat,
    Id {
        id: String,
    },
    Recover {
        gen: u64,
        why: String,
    },
    Plan(Plan),
    Grow {
        gen: u64,
        size: usize,
        after: usize,
    },
    GrowId {
        gen: u64,
        rank: usize,
        size: usize,
        after: usize,
        id: String,
    },
    Excluded {
        why: String,
    },
    End {
        why: String,
    },
}

/// Ranks as `1,3,4`.
pub fn rank_list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Message {
    /// The message's line, without its newline; free text has its line breaks turned into spaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = |s: &str| s.replace(['\n', '\r'], " ");
        match self {
            Message::Hello { rank } => write!(f, "HELLO {rank}"),
            Message::Join => write!(f, "JOIN"),
            Message::Lost { gen, held } => write!(f, "LOST {gen} {}", held.word()),
            Message::Ready { gen } => write!(f, "READY {gen}"),
            Message::Done => write!(f, "DONE"),
            Message::Beat => write!(f, "BEAT"),
            Message::Id { id } => write!(f, "ID {id}"),
            Message::Recover { gen, why } => write!(f, "RECOVER {gen} {}", text(why)),
            Message::Plan(Plan {
                gen,
                rank,
                size,
                step,
                how,
            }) => match how {
                How::Shrink { exclude } => {
                    let exclude = rank_list(exclude);
                    write!(f, "SHRINK {gen} {rank} {size} {step} {exclude}")
                }
                How::Init { id } => write!(f, "INIT {gen} {rank} {size} {step} {id}"),
            },
            Message::Grow { gen, size, after } => write!(f, "GROW {gen} {size} {after}"),
            Message::GrowId {
                gen,
                rank,
                size,
                after,
                id,
            } => write!(f, "GROWID {gen} {rank} {size} {after} {id}"),
            Message::Excluded { why } => write!(f, "EXCLUDED {}", text(why)),
            Message::End { why } => write!(f, "END {}", text(why)),
        }
    }
}

impl Message {
    /// Reads one line (its newline may be there); an error naming the line for anything else.
    pub fn parse(line: &str) -> Result<Message, String> {
        let line = line.trim_end_matches(['\n', '\r']);
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let bad = || format!("not a rendezvous message: {line:?}");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            fields.get(i).and_then(|s| s.parse().ok()).ok_or_else(bad)
        };
        let count = |i: usize| num(i).map(|n| n as usize);
        let token = |i: usize| fields.get(i).map(|s| s.to_string()).ok_or_else(bad);
        let exactly = |n: usize, m: Message| match fields.len() == n {
            true => Ok(m),
            false => Err(bad()),
        };
        // Free text, its line breaks spaces as `Display` writes them (a lone `\r` inside a line is
        // no break to the reader).
        let free = |text: &str| text.replace(['\n', '\r'], " ");
        match word {
            "HELLO" => exactly(1, Message::Hello { rank: count(0)? }),
            "JOIN" => exactly(0, Message::Join),
            "LOST" => {
                let held = Held::from_word(&token(1)?).ok_or_else(bad)?;
                exactly(2, Message::Lost { gen: num(0)?, held })
            }
            "READY" => exactly(1, Message::Ready { gen: num(0)? }),
            "DONE" => exactly(0, Message::Done),
            "BEAT" => exactly(0, Message::Beat),
            "ID" => exactly(1, Message::Id { id: token(0)? }),
            // The generation, then everything after its one space, exactly as written.
            "RECOVER" => {
                let (gen, why) = rest.split_once(' ').unwrap_or((rest, ""));
                Ok(Message::Recover {
                    gen: gen.parse().map_err(|_| bad())?,
                    why: free(why),
                })
            }
            "SHRINK" | "INIT" => {
                let how = match word {
                    "SHRINK" => How::Shrink {
                        exclude: token(4)?
                            .split(',')
                            .map(|r| r.parse().map_err(|_| bad()))
                            .collect::<Result<_, _>>()?,
                    },
                    _ => How::Init { id: token(4)? },
                };
                let plan = Plan {
                    gen: num(0)?,
                    rank: count(1)?,
                    size: count(2)?,
                    step: count(3)?,
                    how,
                };
                exactly(5, Message::Plan(plan))
            }
            "GROW" => exactly(
                3,
                Message::Grow {
                    gen: num(0)?,
                    size: count(1)?,
                    after: count(2)?,
                },
            ),
            "GROWID" => exactly(
                5,
                Message::GrowId {
                    gen: num(0)?,
                    rank: count(1)?,
                    size: count(2)?,
                    after: count(3)?,
                    id: token(4)?,
                },
            ),
            "EXCLUDED" => Ok(Message::Excluded { why: free(rest) }),
            "END" => Ok(Message::End { why: free(rest) }),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_as_written() {
        let plan = |how| {
            Message::Plan(Plan {
                gen: 3,
                rank: 1,
                size: 5,
                step: 40,
                how,
            })
        };
        let all = [
            (Message::Hello { rank: 7 }, "HELLO 7"),
            (Message::Join, "JOIN"),
            (
                Message::Lost {
                    gen: 2,
                    held: Held::Revoked,
                },
                "LOST 2 revoked",
            ),
            (
                Message::Lost {
                    gen: 0,
                    held: Held::Aborted,
                },
                "LOST 0 aborted",
            ),
            (Message::Done, "DONE"),
            (Message::Beat, "BEAT"),
            (Message::Id { id: "00ff".into() }, "ID 00ff"),
            (
                Message::Recover {
                    gen: 4,
                    why: "ranks 1,3 died".into(),
                },
                "RECOVER 4 ranks 1,3 died",
            ),
            (
                plan(How::Shrink {
                    exclude: vec![0, 2, 9],
                }),
                "SHRINK 3 1 5 40 0,2,9",
            ),
            (plan(How::Init { id: "abcd".into() }), "INIT 3 1 5 40 abcd"),
            (Message::Ready { gen: 5 }, "READY 5"),
            (
                Message::Grow {
                    gen: 5,
                    size: 8,
                    after: 77,
                },
                "GROW 5 8 77",
            ),
            (
                Message::GrowId {
                    gen: 5,
                    rank: 6,
                    size: 8,
                    after: 77,
                    id: "12".into(),
                },
                "GROWID 5 6 8 77 12",
            ),
            (
                Message::Excluded {
                    why: "no report within 10 s".into(),
                },
                "EXCLUDED no report within 10 s",
            ),
            (
                Message::End {
                    why: "2 survivors, below --min-size 3".into(),
                },
                "END 2 survivors, below --min-size 3",
            ),
        ];
        for (message, line) in all {
            assert_eq!(message.to_string(), line);
            assert_eq!(Message::parse(&format!("{line}\n")), Ok(message), "{line}");
        }
    }

    #[test]
    fn free_text_stays_on_its_line_and_garbage_is_an_error() {
        let m = Message::Recover {
            gen: 1,
            why: "a\nb".into(),
        };
        assert_eq!(m.to_string(), "RECOVER 1 a b");
        for line in [
            "",
            "HELLO",
            "HELLO x",
            "HELLO 1 2",
            "LOST 1 maybe",
            "SHRINK 1 0 3 0",
            "SHRINK 1 0 3 0 1,x",
            "GROW 1 2",
            "READY",
            "RECOVER  1000",
            "RECOVER x why",
            "WHAT 1",
        ] {
            let err = Message::parse(line).expect_err(line);
            assert!(err.contains("not a rendezvous message"), "{line}: {err}");
        }
    }
}

#[cfg(test)]
mod properties {
    //! Property tests, a bounded number of cases each: every message reads back as written, and any
    //! line at all is an answer, never a panic, no bigger than the line.
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    // Unformatted: rustfmt would spell each struct literal one field a line, a copy of the shape of the
    // protocol's own field lists.
    #[rustfmt::skip]
    fn message() -> impl Strategy<Value = Message> {
        let text = "[^\r\n]{0,40}";
        let id = "[0-9a-f]{1,64}";
        let held = prop_oneof![Just(Held::Revoked), Just(Held::Aborted)];
        let plan = |how| (any::<u64>(), any::<usize>(), any::<usize>(), any::<usize>(), how);
        let how = prop_oneof![
            vec(any::<usize>(), 1..8).prop_map(|exclude| How::Shrink { exclude }),
            id.prop_map(|id| How::Init { id }),
        ];
        let grow = (any::<u64>(), any::<usize>(), any::<usize>());
        prop_oneof![
            any::<usize>().prop_map(|rank| Message::Hello { rank }),
            Just(Message::Join),
            (any::<u64>(), held).prop_map(|(gen, held)| Message::Lost { gen, held }),
            any::<u64>().prop_map(|gen| Message::Ready { gen }),
            Just(Message::Done),
            Just(Message::Beat),
            id.prop_map(|id| Message::Id { id }),
            (any::<u64>(), text).prop_map(|(gen, why)| Message::Recover { gen, why }),
            plan(how).prop_map(|(gen, rank, size, step, how)| {
                Message::Plan(Plan { gen, rank, size, step, how })
            }),
            grow.prop_map(|(gen, size, after)| Message::Grow { gen, size, after }),
            (grow, any::<usize>(), id).prop_map(|((gen, size, after), rank, id)| {
                Message::GrowId { gen, rank, size, after, id }
            }),
            text.prop_map(|why| Message::Excluded { why }),
            text.prop_map(|why| Message::End { why }),
        ]
    }

    /// Lines near the protocol's words (so that the parser's every branch is reached), and anything.
    fn line() -> impl Strategy<Value = String> {
        let near = "(HELLO|JOIN|LOST|READY|DONE|BEAT|ID|RECOVER|SHRINK|INIT|GROW|GROWID|EXCLUDED|END)( [0-9a-z,+-]{0,6}){0,6}[ \t\r\n]{0,2}";
        prop_oneof![near, any::<String>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn every_message_reads_back_as_written(m in message()) {
            prop_assert_eq!(Message::parse(&format!("{m}\n")), Ok(m));
        }

        /// A parsed line's message is no longer than the line (a bare `EXCLUDED`, `END` or `RECOVER
        /// <gen>` gains the space before its empty reason) and reads back as itself.
        #[test]
        fn any_line_is_a_message_or_an_error(line in line()) {
            if let Ok(m) = Message::parse(&line) {
                let written = m.to_string();
                prop_assert!(written.len() <= line.len() + 1, "{:?} -> {:?}", line, written);
                prop_assert_eq!(Message::parse(&written), Ok(m));
            }
        }
    }
}
