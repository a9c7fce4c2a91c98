//! The PKI directory on disk, as written by `waymark certs init` and `issue`.
//!
//! ```text
//! <dir>/root.pem            estate root certificate
//! <dir>/root.key            estate root key                    (0600; keep offline)
//! <dir>/region-<r>.pem      region intermediate certificate
//! <dir>/region-<r>.key      region intermediate key            (0600)
//! <dir>/bundle.pem          trust bundle = the root; what every peer trusts
//! <dir>/issued/<path>/cert.pem       leaf only
//! <dir>/issued/<path>/chain.pem      intermediate(s), leaf excluded (empty for operators)
//! <dir>/issued/<path>/fullchain.pem  leaf + intermediate: what an endpoint presents
//! <dir>/issued/<path>/key.pem        leaf key                  (0600)
//! ```
//!
//! Nodes, authorities and workloads are issued by their own region's intermediate;
//! operators by the estate root, since no region may speak for an estate-wide principal.
//!
//! `<path>` is the identity's path, e.g. `issued/region/eu/node/n1/`; its segments are
//! validated names, so they are safe as directory names. Every file is written to a
//! temporary name and renamed into place, so a watching reloader never sees half a file.
//! Private keys are created 0600 from the start (never widened, then narrowed).

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::ca::{CaError, HostSan, IssuedLeaf, RegionCa, RootCa};
use crate::identity::{Identity, Name, TrustDomain};

/// Why a PKI directory operation failed. Files already written stay; nothing is
/// overwritten except leaves being reissued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The CA refused. Nothing more was written; fix the request.
    #[error("certificate authority refused")]
    Ca(#[from] CaError),
    /// A file could not be read or written. Check the path and permissions.
    #[error("cannot access {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: io::Error,
    },
    /// `init` found a root for another trust domain. Nothing was written; use another
    /// directory.
    #[error("{dir} already holds a root for trust domain {found}")]
    OtherTrustDomain {
        /// The directory.
        dir: PathBuf,
        /// The trust domain of the root found there.
        found: TrustDomain,
    },
    /// No intermediate for the region. Nothing was issued; run `certs init --region`.
    #[error("no intermediate for region {region}; run `waymark certs init --region {region}`")]
    NoRegion {
        /// The region asked for.
        region: Name,
    },
    /// An issuing region was named for an operator. Nothing was issued; operators are
    /// issued by the estate root (its key must be at hand), so name no region.
    #[error("operator identities are issued by the estate root; do not name a region")]
    OperatorRegion {
        /// The region asked for.
        region: Name,
    },
}

/// A PKI directory.
#[derive(Debug, Clone)]
pub struct PkiDir {
    dir: PathBuf,
}

/// What `init` did with each file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitReport {
    /// Files created now.
    pub created: Vec<PathBuf>,
    /// Files that already existed and were kept.
    pub kept: Vec<PathBuf>,
}

/// Where `issue` wrote a leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedPaths {
    /// Leaf certificate.
    pub cert: PathBuf,
    /// Intermediate chain.
    pub chain: PathBuf,
    /// Leaf + chain.
    pub fullchain: PathBuf,
    /// Private key (0600).
    pub key: PathBuf,
}

// === impl PkiDir ===

impl PkiDir {
    /// A PKI rooted at `dir` (created on `init`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `<dir>/root.pem`
    pub fn root_cert(&self) -> PathBuf {
        self.dir.join("root.pem")
    }

    /// `<dir>/root.key`
    pub fn root_key(&self) -> PathBuf {
        self.dir.join("root.key")
    }

    /// `<dir>/bundle.pem`
    pub fn bundle(&self) -> PathBuf {
        self.dir.join("bundle.pem")
    }

    /// `<dir>/region-<r>.pem`
    pub fn region_cert(&self, region: &Name) -> PathBuf {
        self.dir.join(format!("region-{region}.pem"))
    }

    /// `<dir>/region-<r>.key`
    pub fn region_key(&self, region: &Name) -> PathBuf {
        self.dir.join(format!("region-{region}.key"))
    }

    /// `<dir>/issued/<identity path>/`
    pub fn leaf_dir(&self, identity: &Identity) -> PathBuf {
        identity
            .path_segments()
            .into_iter()
            .fold(self.dir.join("issued"), |p, seg| p.join(seg))
    }

    /// Creates the root (unless present) and an intermediate for each region (unless
    /// present), at `now`. Never overwrites a CA file.
    pub fn init(
        &self,
        trust_domain: &TrustDomain,
        regions: &[Name],
        now: SystemTime,
    ) -> Result<InitReport, LayoutError> {
        create_dir(&self.dir)?;
        let mut report = InitReport {
            created: Vec::new(),
            kept: Vec::new(),
        };
        let root = if self.root_cert().exists() {
            let root = self.load_root()?;
            if root.trust_domain() != trust_domain {
                return Err(LayoutError::OtherTrustDomain {
                    dir: self.dir.clone(),
                    found: root.trust_domain().clone(),
                });
            }
            report.kept.extend([self.root_cert(), self.root_key()]);
            root
        } else {
            let root = RootCa::generate(trust_domain.clone(), now)?;
            write_secret(&self.root_key(), root.key_pem().as_bytes())?;
            write_public(&self.root_cert(), root.cert_pem().as_bytes())?;
            report.created.extend([self.root_cert(), self.root_key()]);
            root
        };
        write_public(&self.bundle(), root.cert_pem().as_bytes())?;
        report.created.push(self.bundle());
        for region in regions {
            let (cert, key) = (self.region_cert(region), self.region_key(region));
            if cert.exists() {
                report.kept.extend([cert, key]);
                continue;
            }
            let ca = root.issue_region(region.clone(), now)?;
            write_secret(&key, ca.key_pem().as_bytes())?;
            write_public(&cert, ca.cert_pem().as_bytes())?;
            report.created.extend([cert, key]);
        }
        Ok(report)
    }

    /// Issues a leaf for `identity` from its region's intermediate (operators from the
    /// estate root) and writes it under [`Self::leaf_dir`] (or `out`). `region` is ignored
    /// for identities that name their own, and refused for operators.
    pub fn issue(
        &self,
        identity: &Identity,
        region: Option<&Name>,
        ttl: Duration,
        out: Option<&Path>,
        now: SystemTime,
    ) -> Result<(IssuedLeaf, IssuedPaths), LayoutError> {
        self.issue_with_hosts(identity, region, ttl, out, now, &[])
    }

    /// [`Self::issue`], with the DNS names and addresses a server answers to beside the
    /// identity (for clients that check the dialled name).
    pub fn issue_with_hosts(
        &self,
        identity: &Identity,
        region: Option<&Name>,
        ttl: Duration,
        out: Option<&Path>,
        now: SystemTime,
        hosts: &[HostSan],
    ) -> Result<(IssuedLeaf, IssuedPaths), LayoutError> {
        let leaf = match (identity.region(), region) {
            (Some(own), _) => self
                .load_region(own)?
                .issue_with_hosts(identity, now, ttl, hosts)?,
            (None, None) => self
                .load_root()?
                .issue_with_hosts(identity, now, ttl, hosts)?,
            (None, Some(region)) => {
                return Err(LayoutError::OperatorRegion {
                    region: region.clone(),
                });
            }
        };
        let dir = out.map_or_else(|| self.leaf_dir(identity), Path::to_path_buf);
        create_dir(&dir)?;
        let paths = IssuedPaths {
            cert: dir.join("cert.pem"),
            chain: dir.join("chain.pem"),
            fullchain: dir.join("fullchain.pem"),
            key: dir.join("key.pem"),
        };
        // Key first: a reloader watching fullchain.pem then never pairs a new
        // certificate with the old key for longer than one rename.
        write_secret(&paths.key, leaf.key_pem.as_bytes())?;
        write_public(&paths.cert, leaf.cert_pem.as_bytes())?;
        write_public(&paths.chain, leaf.chain_pem.as_bytes())?;
        write_public(&paths.fullchain, leaf.fullchain_pem().as_bytes())?;
        Ok((leaf, paths))
    }

    /// Loads the root CA.
    pub fn load_root(&self) -> Result<RootCa, LayoutError> {
        let cert = read_text(&self.root_cert())?;
        let key = read_text(&self.root_key())?;
        Ok(RootCa::from_pem(&cert, &key)?)
    }

    /// Loads a region's intermediate CA.
    pub fn load_region(&self, region: &Name) -> Result<RegionCa, LayoutError> {
        let path = self.region_cert(region);
        if !path.exists() {
            return Err(LayoutError::NoRegion {
                region: region.clone(),
            });
        }
        let cert = read_text(&path)?;
        let key = read_text(&self.region_key(region))?;
        Ok(RegionCa::from_pem(&cert, &key)?)
    }
}

/// Writes a private key: created 0600, written under a temporary name, renamed in place.
pub fn write_secret(path: &Path, bytes: &[u8]) -> Result<(), LayoutError> {
    write_atomic(path, bytes, 0o600)
}

/// Writes a certificate or bundle: 0644, written under a temporary name, renamed in place.
pub fn write_public(path: &Path, bytes: &[u8]) -> Result<(), LayoutError> {
    write_atomic(path, bytes, 0o644)
}

fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), LayoutError> {
    let io_err = |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err)?;
    // The umask can only narrow the mode; set it exactly so 0644 stays 0644.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err)?;
    file.write_all(bytes).map_err(io_err)?;
    file.sync_all().map_err(io_err)?;
    fs::rename(&tmp, path).map_err(io_err)
}

fn create_dir(dir: &Path) -> Result<(), LayoutError> {
    fs::create_dir_all(dir).map_err(|source| LayoutError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

fn read_text(path: &Path) -> Result<String, LayoutError> {
    fs::read_to_string(path).map_err(|source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    })
}
