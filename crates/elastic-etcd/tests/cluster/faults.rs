//! etcd's own faults: one member of three stopped changes nothing for the job; two stopped (quorum
//! lost) end every rank with the documented error within the bound.

use crate::fake::{assert_one_coordinator_per_generation, Event, Job, POLL};
use crate::support::{self, Stopped};
use metrale_gpu_elastic_etcd::{Bounds, Error};
use std::time::Instant;

#[test]
fn one_etcd_member_stopped_changes_nothing() {
    let Some((config, _cluster)) = support::exclusive() else {
        return;
    };
    let bounds = Bounds::of(&config);
    let job = Job::steady(&config, "one-member", 3);
    let before = job.events().len();
    // raft's leader, the harder case: the others elect a new one meanwhile.
    let mut stopped = Stopped::default();
    stopped.stop(support::leader(&config));
    // Two TTLs: every lease would have expired had its renewals failed for good.
    let quiet = !job.wait_for(2 * config.lease_ttl, |events| events.len() > before);
    assert!(
        quiet,
        "the job changed with one etcd member stopped: {:?}",
        &job.events()[before..]
    );
    // The job still works: a rank's death is seen and a new generation made, on two etcd members.
    job.kill("r2");
    let bound = bounds.takeover + POLL + 2 * bounds.call;
    assert!(
        job.wait_world(&["r0", "r1"], bound),
        "no generation of r0, r1 within {bound:?}: {:?}",
        job.events()
    );
    let events = job.events();
    assert_one_coordinator_per_generation(&events);
    job.finish_well();
}

#[test]
fn quorum_lost_ends_every_rank_with_the_documented_error_within_the_bound() {
    let Some((config, _cluster)) = support::exclusive() else {
        return;
    };
    let bounds = Bounds::of(&config);
    let job = Job::steady(&config, "quorum", 3);
    let mut stopped = Stopped::default();
    let leader = support::leader(&config);
    stopped.stop(leader);
    stopped.stop((leader + 1) % 3);
    let lost = Instant::now();
    // Each rank: its hold runs out (a TTL at most after the loss), its next look asks etcd once (a call);
    // it may be inside a call (another) or a wait's slice when the hold runs out.
    let bound = bounds.quorum_loss + bounds.call + POLL;
    assert!(
        job.wait_ended(bound),
        "a rank still runs {bound:?} after the quorum was lost: {:?}",
        job.events()
    );
    let ended_after = lost.elapsed();
    let events = job.events();
    // Nothing was made or taken without a quorum.
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Took { at, .. } if *at > lost)),
        "{events:?}"
    );
    for (name, outcome) in job.finish() {
        match outcome {
            Err(e @ Error::QuorumLost { .. }) => {
                let text = e.to_string();
                for endpoint in &config.endpoints {
                    assert!(
                        text.contains(endpoint.as_str()),
                        "{name}'s error does not name {endpoint}: {text}"
                    );
                }
                assert!(
                    text.contains("lost its quorum") && text.contains("endpoint health"),
                    "{text}"
                );
            }
            other => panic!(
                "{name} ended with {other:?}, not the quorum's loss ({ended_after:?} after it)"
            ),
        }
    }
}
