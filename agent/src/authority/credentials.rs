//! Credentials minted in process, by whoever already holds the member: `waymark dev`
//! writes an operator's token into its state folder, and tests authenticate as an
//! operator the same way. Over the API, the same steps are `POST /v1/acl/bootstrap` (with
//! an operator certificate) and `POST /v1/acl/tokens`.

use std::time::Duration;

use anyhow::Context as _;
use waymark_registry::acl::{
    AclCommand, AclError, Capability, Grant, Grantee, TokenRecord, bearer, bootstrap_grants,
    secret_digest,
};
use waymark_registry::state::{Command, Stamped};

use super::api::new_secret;
use super::clock::now_ms;
use super::raft::RaftNode;
use waymark_registry::machine::{Request, Response};

/// Bootstraps the region for `operator` if nobody has yet, then mints a token named
/// `token` (replacing one of that name) that holds every capability `operator` holds
/// from bootstrap, valid for `ttl`.
/// Returns the bearer form (`wmt.<name>.<secret>`). Must run on the leader.
pub async fn operator_token(
    raft: &RaftNode,
    operator: &str,
    token: &str,
    ttl: Duration,
) -> anyhow::Result<String> {
    match apply(
        raft,
        AclCommand::Bootstrap {
            operator: operator.to_owned(),
            token: None,
        },
    )
    .await
    {
        Ok(()) | Err(Refused::Acl("already_bootstrapped")) => {}
        Err(e) => return Err(e.into()),
    }
    // A token of that name from an earlier start goes, with its grants.
    match apply(
        raft,
        AclCommand::RemoveToken {
            name: token.to_owned(),
        },
    )
    .await
    {
        Ok(()) | Err(Refused::Registry(..)) => {}
        Err(e) => return Err(e.into()),
    }
    let capabilities: Vec<Capability> = bootstrap_grants(operator)
        .into_iter()
        .filter(|g| g.to == Grantee::Operator(operator.to_owned()))
        .map(|g| g.can)
        .collect();
    mint(
        raft,
        token,
        &capabilities,
        ttl,
        format!("operator/{operator}"),
        format!("minted in process for operator/{operator}"),
    )
    .await
}

/// While the region is not bootstrapped, bootstrap it for the token's name and store
/// `bearer` (its digest) with every operator grant, valid for the longest token lifetime.
/// Retries until this member has done it or sees it done; returns at once when another
/// member (or an operator) bootstrapped first. Runs on every member; only a leader's
/// proposals commit.
pub async fn ensure_initial_management(raft: RaftNode, bearer_text: String) {
    let Some((name, secret)) = waymark_registry::acl::parse_bearer(bearer_text.trim()) else {
        tracing::error!(
            "authority.acl.initial_management_token_file: not a token of the form \
             wmt.<name>.<secret>; ignored"
        );
        return;
    };
    let (name, secret) = (name.to_owned(), secret.to_owned());
    let mut wait = Duration::from_millis(200);
    loop {
        if raft.with_state(|state, _| state.registry().acl().is_bootstrapped()) {
            return;
        }
        if raft.is_leader() {
            match initial_management(&raft, &name, &secret).await {
                Ok(()) => {
                    tracing::info!(operator = %name, "region bootstrapped with the initial management token");
                    return;
                }
                Err(Refused::Acl("already_bootstrapped")) => return,
                Err(error) => {
                    tracing::warn!(%error, "bootstrapping with the initial management token; retrying")
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

async fn initial_management(raft: &RaftNode, name: &str, secret: &str) -> Result<(), Refused> {
    // One command: the token exists only with every grant it was configured for.
    let now = now_ms();
    apply(
        raft,
        AclCommand::Bootstrap {
            operator: name.to_owned(),
            token: Some(TokenRecord {
                name: name.to_owned(),
                secret_sha256: secret_digest(secret),
                created_by: "configuration".into(),
                created_at_ms: now,
                expires_at_ms: now.saturating_add(waymark_registry::acl::TOKEN_TTL_MS_MAX),
                description: "authority.acl.initial_management_token_file".into(),
            }),
        },
    )
    .await
}

/// A fresh bearer token named `name`, never stored anywhere: for
/// `authority.acl.initial_management_token_file`.
pub fn generate(name: &str) -> anyhow::Result<String> {
    if waymark_registry::acl::parse_bearer(&bearer(name, "x")).is_none() {
        anyhow::bail!("a token name is 1 to 64 of [a-z0-9-]");
    }
    Ok(bearer(name, &new_secret().map_err(anyhow::Error::msg)?))
}

/// Mints a token with exactly `capabilities` (the region must be bootstrapped).
pub async fn token_with(
    raft: &RaftNode,
    token: &str,
    capabilities: &[Capability],
    ttl: Duration,
) -> anyhow::Result<String> {
    mint(
        raft,
        token,
        capabilities,
        ttl,
        "waymark".into(),
        String::new(),
    )
    .await
}

/// Stores a fresh token (its digest) with `capabilities`; returns its bearer form.
async fn mint(
    raft: &RaftNode,
    token: &str,
    capabilities: &[Capability],
    ttl: Duration,
    created_by: String,
    description: String,
) -> anyhow::Result<String> {
    let secret = new_secret().map_err(anyhow::Error::msg)?;
    let now = now_ms();
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    apply(
        raft,
        AclCommand::PutToken {
            token: TokenRecord {
                name: token.to_owned(),
                secret_sha256: secret_digest(&secret),
                created_by,
                created_at_ms: now,
                expires_at_ms: now.saturating_add(ttl_ms),
                description,
            },
        },
    )
    .await?;
    grant_token(raft, token, capabilities).await?;
    Ok(bearer(token, &secret))
}

async fn grant_token(
    raft: &RaftNode,
    token: &str,
    capabilities: &[Capability],
) -> anyhow::Result<()> {
    for can in capabilities {
        let grant = Grant {
            to: Grantee::Token(token.to_owned()),
            can: can.clone(),
        };
        apply(raft, AclCommand::Grant { grant }).await?;
    }
    Ok(())
}

/// Why an in-process change did not apply.
#[derive(Debug, thiserror::Error)]
enum Refused {
    /// The registry refused it, for this reason.
    #[error("refused ({0}): {1}")]
    Registry(String, String),
    /// The access-control core refused it, for this reason.
    #[error("refused ({0})")]
    Acl(&'static str),
    /// It was not committed.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

async fn apply(raft: &RaftNode, change: AclCommand) -> Result<(), Refused> {
    if let Err(e) = waymark_registry::acl::Acl::check(&change) {
        return Err(Refused::Acl(e.reason()));
    }
    let request = Request::Registry(Stamped {
        at_ms: now_ms(),
        command: Command::Acl { change },
    });
    let response = raft
        .write(request)
        .await
        .context("proposing an access-control change")?;
    match response {
        Response::Registry { outcome: Ok(_) } => Ok(()),
        Response::Registry {
            outcome: Err(refusal),
        } if refusal.reason == AclError::AlreadyBootstrapped.reason() => {
            Err(Refused::Acl("already_bootstrapped"))
        }
        Response::Registry {
            outcome: Err(refusal),
        } => Err(Refused::Registry(refusal.reason, refusal.message)),
        other => Err(Refused::Other(anyhow::anyhow!(
            "unexpected answer: {other:?}"
        ))),
    }
}
