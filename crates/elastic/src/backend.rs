//! Which membership a rank lives on: the one kept in etcd where `Config::etcd` names a store
//! (feature `etcd`), else the embedded one (a coordinator on rank 0, a client of it on the others).
//! Both run the same lives (`recovery.rs`).

use crate::client::Client;
use crate::config::{Config, First};
use crate::coordinator::Coordinator;
use crate::fabric::Fabric;
use crate::membership::Membership;
use crate::recovery::{first_life, replacement_life, STARTUP};

/// A rank's life on `fabric`: a rank of the first world ([`Config::first`]) or a replacement. What
/// [`crate::run`] does on NCCL; the CPU tests run it on fake ranks.
pub fn run_with<F: Fabric>(config: &Config, fabric: &mut F) -> Result<(), String> {
    #[cfg(feature = "etcd")]
    if let Some(store) = &config.etcd {
        return crate::etcd::run(config, store, fabric);
    }
    let master = config.master.as_deref().ok_or(NO_MASTER)?;
    match config.first {
        Some(first) => run_member(config, master, first, fabric),
        None => run_replacement(config, master, fabric),
    }
}

/// Why the embedded membership cannot start without [`Config::master`].
const NO_MASTER: &str = "the embedded membership needs rank 0's address (Config::master): pass --master \
    HOST:PORT or set MASTER_ADDR on every rank, or keep the membership in etcd (METRALE_ETCD_ENDPOINTS, \
    feature etcd)";

/// A rank of the first world: rendezvous, init, training, and recovery as it comes.
fn run_member<F: Fabric>(
    args: &Config,
    master: &str,
    first: First,
    fabric: &mut F,
) -> Result<(), String> {
    let First { rank, world_size } = first;
    let (who, id) = if rank == 0 {
        let id = fabric.new_id()?;
        let coordinator = Coordinator::listen(master, world_size, args.min_size, &id)?;
        fabric.say(format!(
            "ELASTIC phase=listening port={}",
            coordinator.port()
        ))?;
        coordinator.wait_members(STARTUP)?;
        (Box::new(coordinator) as Box<dyn Membership>, id)
    } else {
        let (client, id) = Client::hello(master, rank, STARTUP)?;
        (Box::new(client) as Box<dyn Membership>, id)
    };
    first_life(args, first, fabric, who.as_ref(), &id)
}

/// A replacement: joins through the rendezvous and the grow, then lives as the others do.
fn run_replacement<F: Fabric>(args: &Config, master: &str, fabric: &mut F) -> Result<(), String> {
    let (who, joined) = Client::join(master, STARTUP)?;
    replacement_life(args, fabric, &who, &joined)
}
