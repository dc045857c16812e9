//! The two writes of a Gateway's Service, each conditional on the Service as the pass read
//! it, like the ProxyConfig writes: one decided on what has changed since (another writer's
//! change, or a store that lagged) is refused with a conflict (409), and the change of the
//! Service brings a pass that reads it afresh.

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};

/// The field manager of Gateways' Services.
pub const SERVICE_MANAGER: &str = "switchyard-gateway";

/// Applies `desired` over `current` (the Service as read, if there is one of that name),
/// conditional on its resourceVersion. A first write cannot be conditional: any writer
/// makes it from the same inputs. (A create would be refused over one not read, but
/// would leave its fields to a manager the later applies are not: ports it listed would
/// never go.)
pub async fn apply_as_read(
    api: &Api<Service>,
    desired: &Service,
    current: Option<&Service>,
) -> Result<(), kube::Error> {
    let name = desired.metadata.name.clone().unwrap_or_default();
    let mut desired = desired.clone();
    desired.metadata.resource_version = current
        .filter(|c| c.metadata.name == desired.metadata.name)
        .and_then(|c| c.metadata.resource_version.clone());
    let params = PatchParams::apply(SERVICE_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(&desired)).await?;
    Ok(())
}

/// Deletes `stale` as read: its uid and resourceVersion are the preconditions.
pub async fn delete_as_read(api: &Api<Service>, stale: &Service) -> Result<(), kube::Error> {
    let name = stale.metadata.name.clone().unwrap_or_default();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: stale.metadata.uid.clone(),
            resource_version: stale.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    api.delete(&name, &params).await?;
    Ok(())
}
