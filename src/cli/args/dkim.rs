//! `dkim …`: keys that sign the mail, and what they sign with.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum DkimCommand {
    /// Generate a key for a domain, store it, and print the DNS TXT record
    ///
    /// Publish the record before sending: receivers look the key up at
    /// SELECTOR._domainkey.DOMAIN. One active key per algorithm and domain;
    /// a domain with an RSA and an ed25519 key gets both signatures.
    Keygen {
        /// The From domain to sign for, e.g. example.com
        domain: String,
        /// Selector: the DNS label the key is published under (default
        /// mailsplit; mailsplit-ed25519 when the domain already uses mailsplit)
        #[arg(long)]
        selector: Option<String>,
        /// What the key signs with
        #[arg(long, value_enum, default_value_t = Algorithm::Rsa)]
        algorithm: Algorithm,
    },
    /// Domains, selectors, algorithms, states (active, pending, retired) and
    /// the TXT record of each key
    List,
    /// Delete a domain's keys; its mail goes out unsigned
    Delete {
        domain: String,
        /// Delete only the key with this selector
        #[arg(long)]
        selector: Option<String>,
    },
    /// Make a new key for a domain (pending) and print its TXT record
    ///
    /// Mail stays signed with the active key until `dkim activate`, so the
    /// new record can be published first.
    Rotate {
        domain: String,
        /// What the new key signs with (default: the algorithm of the
        /// domain's active key)
        #[arg(long, value_enum)]
        algorithm: Option<Algorithm>,
        /// Selector of the new key (default mailsplit-YYYYMMDD)
        #[arg(long)]
        selector: Option<String>,
    },
    /// Sign the domain's mail with this key from now on (workers within
    /// seconds); the active key of its algorithm is retired
    Activate { domain: String, selector: String },
}

/// `--algorithm`: what a DKIM key signs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algorithm {
    /// RSA 2048 with SHA-256: verified by every receiver.
    Rsa,
    /// Ed25519 (RFC 8463): small and fast, not yet verified everywhere.
    Ed25519,
}

impl From<Algorithm> for crate::dkim::DkimAlgorithm {
    fn from(a: Algorithm) -> Self {
        match a {
            Algorithm::Rsa => crate::dkim::DkimAlgorithm::Rsa,
            Algorithm::Ed25519 => crate::dkim::DkimAlgorithm::Ed25519,
        }
    }
}
