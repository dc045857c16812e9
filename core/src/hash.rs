//! Content hashes used as versions. Same input, same hash, on every replica and every run (I6).

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Hex SHA-256 of bytes, shortened to 16 characters: plenty to tell versions apart.
pub fn digest(bytes: &[u8]) -> String {
    let full = Sha256::digest(bytes);
    hex::encode(&full[..8])
}

/// Version of an xDS resource: XXH3-128 of its encoded bytes, as 32 hex characters.
/// Not cryptographic, and need not be: it only tells contents apart, and SHA-256 of every
/// resource was the largest single cost of a full translation.
pub fn resource_version(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// Digest of a value's JSON form. Serialize impls of the model only use ordered
/// containers, so the JSON is canonical.
pub fn digest_of<T: Serialize>(value: &T) -> String {
    // Serializing plain model structs to a Vec cannot fail; fall back to the Debug form anyway.
    match serde_json::to_vec(value) {
        Ok(bytes) => digest(&bytes),
        Err(err) => digest(err.to_string().as_bytes()),
    }
}

/// Digest of `name=version` lines: the version of a set of resources. XXH3-128, like
/// [`resource_version`]: it runs over every resource of every snapshot.
pub fn digest_of_versions<N: AsRef<str>, V: AsRef<str>>(
    entries: impl IntoIterator<Item = (N, V)>,
) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    for (name, version) in entries {
        hasher.update(name.as_ref().as_bytes());
        hasher.update(b"=");
        hasher.update(version.as_ref().as_bytes());
        hasher.update(b"\n");
    }
    format!("{:032x}", hasher.digest128())
}
