//! The coordinating role: held by the member whose lease holds the job's `coordinator` key, taken by
//! whoever creates the key while it is absent. A term is the key's create revision: every write of the
//! coordinator is a transaction that compares it, so once the holder's lease has expired (and another
//! member may have taken the role) none of its writes lands. Two members never write as coordinator in
//! the same term, and a deposed one never writes after its successor's term began.

use crate::error::Error;
use crate::member::{check_key, check_name, check_value, Holder, Member};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

/// The role, as a campaign won it: the term it fences the writes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    since: i64,
}

impl Leadership {
    /// The term: the revision at which this member took the role.
    pub fn since(&self) -> i64 {
        self.since
    }
}

/// What a campaign came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// This member holds the role (it took it now, or held it already).
    Won(Leadership),
    /// Another member holds it.
    Held(Holder),
}

impl Member {
    /// Takes the coordinating role if no live member holds it: one call. A member that lost waits with
    /// [`Member::wait_change`] and campaigns again: the role is free once its holder's lease is revoked or
    /// expires (at most one TTL after the holder's last renewal, and etcd checks for expired leases every
    /// 500 ms).
    pub fn campaign(&self) -> Result<Campaign, Error> {
        let key = self.key("coordinator");
        let (id, name) = (self.lease.id, self.name.clone().into_bytes());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                name,
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let answer = self.call(
            "a campaign",
            txn,
            |mut c, txn| async move { c.txn(txn).await },
        )?;
        if answer.succeeded() {
            // The put's revision is the key's create revision: it did not exist.
            let since = answer.header().map_or(0, |h| h.revision());
            return Ok(Campaign::Won(Leadership { since }));
        }
        match holder_of(&answer) {
            // This member's own key, from an earlier campaign: it holds the role still.
            Some((holder, lease)) if lease == self.lease.id => Ok(Campaign::Won(Leadership {
                since: holder.since,
            })),
            Some((holder, _)) => Ok(Campaign::Held(holder)),
            // It vanished between the compare and the read: the transaction is one, so this cannot be.
            None => Err(self.etcd.unavailable(
                "a campaign",
                "the coordinator key vanished within one transaction".into(),
            )),
        }
    }

    /// Writes `value` at state `key` as the coordinator of `term`: refused with [`Error::Deposed`] where
    /// another term holds the role. Returns the revision of the write.
    pub fn put_state(&self, term: &Leadership, key: &str, value: &[u8]) -> Result<i64, Error> {
        check_key(key)?;
        check_value("a state value", value)?;
        let op = TxnOp::put(self.key(&format!("state/{key}")), value.to_vec(), None);
        let answer = self.fenced(term, &format!("the write of state '{key}'"), [op])?;
        Ok(answer.header().map_or(0, |h| h.revision()))
    }

    /// Writes `value` at state `key` as the coordinator of `term` where the key does not exist yet: `true`
    /// when written, `false` when it existed (whoever wrote it). For what is written once per
    /// generation: a generation's plan, its unique id.
    pub fn create_state(&self, term: &Leadership, key: &str, value: &[u8]) -> Result<bool, Error> {
        check_key(key)?;
        check_value("a state value", value)?;
        let full = self.key(&format!("state/{key}"));
        let inner = Txn::new()
            .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(full, value.to_vec(), None)]);
        let answer = self.fenced(
            term,
            &format!("the creation of state '{key}'"),
            [TxnOp::txn(inner)],
        )?;
        Ok(matches!(answer.op_responses().first(), Some(TxnOpResponse::Txn(t)) if t.succeeded()))
    }

    /// Deletes the state keys under `key` (the key itself and `key/...`) and the reports on `topic`, if
    /// given, as the coordinator of `term`: the leftovers of a generation.
    pub fn clear(&self, term: &Leadership, key: &str, topic: Option<&str>) -> Result<(), Error> {
        check_key(key)?;
        let mut ops = vec![
            TxnOp::delete(self.key(&format!("state/{key}")), None),
            TxnOp::delete(
                self.key(&format!("state/{key}/")),
                Some(DeleteOptions::new().with_prefix()),
            ),
        ];
        if let Some(topic) = topic {
            check_name("a topic", topic)?;
            ops.push(TxnOp::delete(
                self.key(&format!("reports/{topic}/")),
                Some(DeleteOptions::new().with_prefix()),
            ));
        }
        self.fenced(term, &format!("the clearing of state '{key}'"), ops)
            .map(drop)
    }

    /// Ends the job as the coordinator of `term`: deletes its state, its reports and the role. The
    /// members' own keys vanish as each leaves.
    pub fn end_job(&self, term: Leadership) -> Result<(), Error> {
        let ops = ["state/", "reports/", "coordinator"].map(|rest| {
            TxnOp::delete(
                self.key(rest),
                (rest != "coordinator").then(|| DeleteOptions::new().with_prefix()),
            )
        });
        self.fenced(&term, "the end of the job", ops).map(drop)
    }

    /// Runs `ops` where `term` still holds the role, in one transaction; [`Error::Deposed`] (naming the
    /// holder) where it does not.
    fn fenced(
        &self,
        term: &Leadership,
        what: &str,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<TxnResponse, Error> {
        let key = self.key("coordinator");
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                term.since,
            )])
            .and_then(ops)
            .or_else([TxnOp::get(key, None)]);
        let answer = self.call(what, txn, |mut c, txn| async move { c.txn(txn).await })?;
        if answer.succeeded() {
            return Ok(answer);
        }
        Err(Error::Deposed {
            what: what.into(),
            holder: holder_of(&answer).map(|(h, _)| h.name),
        })
    }
}

/// The coordinator and its lease, from a transaction whose else branch read the `coordinator` key.
fn holder_of(answer: &TxnResponse) -> Option<(Holder, i64)> {
    answer.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(got) => got.kvs().first().map(|kv| {
            let name = String::from_utf8_lossy(kv.value()).into_owned();
            (
                Holder {
                    name,
                    since: kv.create_revision(),
                },
                kv.lease(),
            )
        }),
        _ => None,
    })
}
