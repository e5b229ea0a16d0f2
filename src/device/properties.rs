//! A communicator's properties (`ncclCommQueryProperties`, NCCL 2.29+), and the check that it can serve a
//! device-API kernel.

use crate::bindings::ncclComm_t;
#[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
use crate::bindings::{ncclCommProperties_t, ncclCommQueryProperties};
#[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
use crate::check::check_nccl;
use crate::error::GpuError;

/// `ncclCommQueryProperties` of `comm` (NCCL 2.29+), into a value that starts as
/// `NCCL_COMM_PROPERTIES_INITIALIZER` (the size, magic and version NCCL checks).
///
/// # Safety
/// `comm` is a live communicator (from `ncclCommInitRank*`, not destroyed), not destroyed during the call.
#[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
pub unsafe fn query_properties(comm: ncclComm_t) -> Result<ncclCommProperties_t, GpuError> {
    let mut properties = ncclCommProperties_t::default();
    // SAFETY: the caller promises `comm`; NCCL writes one ncclCommProperties_t, whose versioned header
    // the initializer filled.
    let result = unsafe { ncclCommQueryProperties(comm, &mut properties) };
    check_nccl(result, "ncclCommQueryProperties")?;
    Ok(properties)
}

/// `Ok` where `comm` supports the device API and has at most `max_lsa_teams` LSA teams (1 for a kernel
/// that reaches every rank through LSA pointers); otherwise [`GpuError::DeviceApiUnsupported`] saying
/// which. With NCCL 2.28 headers, which have no `ncclCommQueryProperties`, there is nothing to ask:
/// `Ok`, and `ncclDevCommCreate` reports an unsupported communicator itself.
///
/// # Safety
/// As `query_properties`': `comm` is a live communicator.
///
/// [`GpuError::DeviceApiUnsupported`]: crate::nccl::GpuError::DeviceApiUnsupported
pub unsafe fn require_device_api(comm: ncclComm_t, max_lsa_teams: i32) -> Result<(), GpuError> {
    #[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
    {
        // SAFETY: the caller promises `comm`.
        let properties = unsafe { query_properties(comm) }?;
        check(&properties, max_lsa_teams)
    }
    #[cfg(not(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER"))]
    {
        let _ = (comm, max_lsa_teams);
        Ok(())
    }
}

/// What [`require_device_api`] concludes from the properties.
#[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
fn check(properties: &ncclCommProperties_t, max_lsa_teams: i32) -> Result<(), GpuError> {
    let reason = if !properties.deviceApiSupport {
        format!(
            "rank {} of {} on CUDA device {} reports no device API support (deviceApiSupport is false): \
             the device API needs GPUs that reach each other through NVLink or PCIe peer access (compute \
             capability 7.0+); ranks sharing one GPU need NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1",
            properties.rank, properties.nRanks, properties.cudaDev
        )
    } else if properties.nLsaTeams > max_lsa_teams {
        format!(
            "rank {} of {} has {} LSA teams, more than the {max_lsa_teams} the kernel handles: not every \
             rank can load and store every other's memory (ranks on several hosts, or GPUs without peer \
             access)",
            properties.rank, properties.nRanks, properties.nLsaTeams
        )
    } else {
        return Ok(());
    };
    Err(GpuError::DeviceApiUnsupported {
        context: "require_device_api".to_string(),
        reason,
    })
}

#[cfg(all(test, nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER"))]
mod tests {
    use super::*;

    #[test]
    fn the_check_names_what_the_communicator_lacks() {
        let mut properties = ncclCommProperties_t::default();
        (properties.rank, properties.nRanks, properties.nLsaTeams) = (1, 4, 1);
        let unsupported = check(&properties, 1).unwrap_err().to_string();
        assert!(
            unsupported.contains("rank 1 of 4")
                && unsupported.contains("deviceApiSupport is false")
                && unsupported.contains("NCCL_MULTI_RANK_GPU_ENABLE=1"),
            "{unsupported}"
        );
        properties.deviceApiSupport = true;
        assert_eq!(check(&properties, 1), Ok(()));
        properties.nLsaTeams = 2;
        let teams = check(&properties, 1).unwrap_err().to_string();
        assert!(
            teams.contains("has 2 LSA teams, more than the 1"),
            "{teams}"
        );
        assert_eq!(check(&properties, 2), Ok(()));
    }
}
