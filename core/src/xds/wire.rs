//! Responses on the wire: a gRPC message encoded piece by piece from the snapshot's
//! shared resources.
//!
//! A response refers to the snapshot's resources instead of owning copies of them, and
//! its bytes are produced only when the HTTP/2 stream has room for them. A thousand
//! Envoys syncing 10 MB each therefore cost the resources once plus a send buffer per
//! stream, not ten gigabytes of message copies.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len, string};

use super::snapshot::Resource;

/// An xDS response as the session decides it; the server encodes it with [`Frames`].
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    Sotw(SotwResponse),
    Delta(DeltaResponse),
}

/// `envoy.service.discovery.v3.DiscoveryResponse`.
#[derive(Clone, Debug, PartialEq)]
pub struct SotwResponse {
    pub version_info: String,
    pub type_url: String,
    pub nonce: String,
    pub resources: Vec<Arc<Resource>>,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaResponse {
    pub system_version_info: String,
    pub type_url: String,
    pub nonce: String,
    pub resources: Vec<Arc<Resource>>,
    pub removed_resources: Vec<String>,
}

impl Response {
    pub fn type_url(&self) -> &str {
        match self {
            Response::Sotw(r) => &r.type_url,
            Response::Delta(r) => &r.type_url,
        }
    }

    pub fn nonce(&self) -> &str {
        match self {
            Response::Sotw(r) => &r.nonce,
            Response::Delta(r) => &r.nonce,
        }
    }

    fn resources(&self) -> &[Arc<Resource>] {
        match self {
            Response::Sotw(r) => &r.resources,
            Response::Delta(r) => &r.resources,
        }
    }

    /// Length of the encoded message, without the gRPC prefix.
    fn encoded_len(&self) -> usize {
        let head = match self {
            Response::Sotw(r) => string::encoded_len(1, &r.version_info),
            Response::Delta(r) => string::encoded_len(1, &r.system_version_info),
        };
        let resources: usize = self
            .resources()
            .iter()
            .map(|r| length_delimited_len(RESOURCES, self.resource_len(r)))
            .sum();
        head + resources + self.tail_len()
    }

    /// Length of one entry of the `resources` field: an `Any` in SotW, a
    /// `Resource { version, resource, name }` in delta.
    fn resource_len(&self, resource: &Resource) -> usize {
        match self {
            Response::Sotw(_) => resource.body.encoded_len(),
            Response::Delta(_) => delta_resource_len(resource),
        }
    }

    fn write_head(&self, out: &mut BytesMut) {
        match self {
            Response::Sotw(r) => string::encode(1, &r.version_info, out),
            Response::Delta(r) => string::encode(1, &r.system_version_info, out),
        }
    }

    /// One entry of `resources` up to the bytes of the resource's body: the body goes
    /// next, then [`Response::write_after_body`].
    fn write_before_body(&self, resource: &Resource, out: &mut BytesMut) {
        encode_key(RESOURCES, WireType::LengthDelimited, out);
        encode_varint(self.resource_len(resource) as u64, out);
        if let Response::Delta(_) = self {
            string::encode(1, &resource.version, out);
            encode_key(2, WireType::LengthDelimited, out);
            encode_varint(resource.body.encoded_len() as u64, out);
        }
        // The `Any`: its type URL, then the key and length of its value; empty fields are
        // left out, as prost leaves them out of `encoded_len`.
        if !resource.body.type_url.is_empty() {
            string::encode(1, &resource.body.type_url, out);
        }
        if !resource.body.value.is_empty() {
            encode_key(2, WireType::LengthDelimited, out);
            encode_varint(resource.body.value.len() as u64, out);
        }
    }

    fn write_after_body(&self, resource: &Resource, out: &mut BytesMut) {
        if let Response::Delta(_) = self {
            string::encode(3, &resource.name, out);
        }
    }

    fn tail_len(&self) -> usize {
        match self {
            Response::Sotw(r) => {
                string::encoded_len(4, &r.type_url) + string::encoded_len(5, &r.nonce)
            }
            Response::Delta(r) => {
                string::encoded_len(4, &r.type_url)
                    + string::encoded_len(5, &r.nonce)
                    + string::encoded_len_repeated(6, &r.removed_resources)
            }
        }
    }

    fn write_tail(&self, out: &mut BytesMut) {
        match self {
            Response::Sotw(r) => {
                string::encode(4, &r.type_url, out);
                string::encode(5, &r.nonce, out);
            }
            Response::Delta(r) => {
                string::encode(4, &r.type_url, out);
                string::encode(5, &r.nonce, out);
                string::encode_repeated(6, &r.removed_resources, out);
            }
        }
    }
}

/// Field number of `resources` in both response messages.
const RESOURCES: u32 = 2;

fn length_delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn delta_resource_len(resource: &Resource) -> usize {
    string::encoded_len(1, &resource.version)
        + prost::encoding::message::encoded_len(2, &resource.body)
        + string::encoded_len(3, &resource.name)
}

/// Pieces of up to this size go to the stream at once: big enough that framing costs
/// nothing, small enough that a stream holds little beyond HTTP/2's own send buffer.
pub const CHUNK: usize = 64 * 1024;

/// Bodies larger than this are not copied: the stream sends the resource's own bytes
/// (the route configuration of 10k routes is one 857 KB resource).
pub const SHARED_BODY: usize = 16 * 1024;

/// One response as a gRPC length-prefixed message, produced a chunk at a time.
pub struct Frames {
    response: Response,
    len: u32,
    /// Resources written so far; `None` before the prefix and head are written.
    next: Option<usize>,
    /// A large body and what follows it, to hand out before encoding more.
    queued: VecDeque<Bytes>,
    done: bool,
}

/// The body of a shared resource as `Bytes`, without copying it.
struct BodyOf(Arc<Resource>);

impl AsRef<[u8]> for BodyOf {
    fn as_ref(&self) -> &[u8] {
        &self.0.body.value
    }
}

/// A response over gRPC's 4 GiB message limit.
#[derive(Debug, thiserror::Error)]
#[error("{type_url} response of {len} bytes is over gRPC's message limit")]
pub struct TooLarge {
    pub type_url: String,
    pub len: usize,
}

impl Frames {
    pub fn new(response: Response) -> Result<Self, TooLarge> {
        let len = response.encoded_len();
        let Ok(len32) = u32::try_from(len) else {
            return Err(TooLarge {
                type_url: response.type_url().to_string(),
                len,
            });
        };
        Ok(Self {
            response,
            len: len32,
            next: None,
            queued: VecDeque::new(),
            done: false,
        })
    }

    /// The next piece: up to [`CHUNK`] bytes of encoded resources (more only for a
    /// single entry that is larger), or one large body shared with the snapshot. None once
    /// the message is complete.
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(queued) = self.queued.pop_front() {
            return Some(queued);
        }
        if self.done {
            return None;
        }
        let mut out = BytesMut::with_capacity(CHUNK);
        let mut next = match self.next {
            Some(next) => next,
            None => {
                // The gRPC prefix: not compressed, then the length, big-endian.
                out.put_u8(0);
                out.put_u32(self.len);
                self.response.write_head(&mut out);
                0
            }
        };
        let resources = self.response.resources();
        while let Some(resource) = resources.get(next) {
            let inline = resource.body.value.len() <= SHARED_BODY;
            let entry_len = length_delimited_len(RESOURCES, self.response.resource_len(resource));
            // Stop short of the chunk size rather than past it: the buffer never grows.
            if inline && out.len() + entry_len > CHUNK && !out.is_empty() {
                break;
            }
            next += 1;
            self.response.write_before_body(resource, &mut out);
            if inline {
                out.put_slice(&resource.body.value);
                self.response.write_after_body(resource, &mut out);
                continue;
            }
            self.queued
                .push_back(Bytes::from_owner(BodyOf(resource.clone())));
            let mut after = BytesMut::new();
            self.response.write_after_body(resource, &mut after);
            if !after.is_empty() {
                self.queued.push_back(after.freeze());
            }
            break;
        }
        self.next = Some(next);
        if next == resources.len() {
            let mut tail = BytesMut::new();
            self.response.write_tail(&mut tail);
            if self.queued.is_empty() {
                out.unsplit(tail);
            } else {
                self.queued.push_back(tail.freeze());
            }
            self.done = true;
        }
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::snapshot::{CLUSTER, ENDPOINT};
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource as DeltaResource,
    };
    use envoy_types::pb::google::protobuf::Any;

    fn resource(type_url: &str, name: &str, size: usize) -> Arc<Resource> {
        Arc::new(Resource::new(
            name,
            Any {
                type_url: type_url.to_string(),
                value: name.bytes().cycle().take(size).collect(),
            },
        ))
    }

    /// The whole framed message, checked for its prefix and returned without it.
    fn encode(response: Response) -> Vec<u8> {
        let mut frames = Frames::new(response).expect("small response");
        let mut bytes = Vec::new();
        while let Some(chunk) = frames.next_chunk() {
            assert!(!chunk.is_empty());
            bytes.extend_from_slice(&chunk);
        }
        assert_eq!(bytes[0], 0, "not compressed");
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        assert_eq!(len, bytes.len() - 5, "prefix length");
        bytes.split_off(5)
    }

    fn many() -> Vec<Arc<Resource>> {
        // Enough to span several chunks, with one resource larger than a chunk.
        let mut resources: Vec<_> = (0..300)
            .map(|i| resource(ENDPOINT, &format!("cluster-{i}"), 700))
            .collect();
        resources.push(resource(ENDPOINT, "big", 3 * CHUNK));
        resources
    }

    #[test]
    fn sotw_decodes_as_the_message_prost_would_build() {
        let resources = many();
        let response = SotwResponse {
            version_info: "v1".into(),
            type_url: ENDPOINT.into(),
            nonce: "7".into(),
            resources: resources.clone(),
        };
        let bytes = encode(Response::Sotw(response));
        let expected = DiscoveryResponse {
            version_info: "v1".into(),
            resources: resources.iter().map(|r| r.body.clone()).collect(),
            type_url: ENDPOINT.into(),
            nonce: "7".into(),
            ..Default::default()
        };
        assert_eq!(bytes.len(), expected.encoded_len());
        assert_eq!(
            DiscoveryResponse::decode(bytes.as_slice()).ok(),
            Some(expected)
        );
    }

    #[test]
    fn delta_decodes_as_the_message_prost_would_build() {
        let resources = many();
        let response = DeltaResponse {
            system_version_info: "s1".into(),
            type_url: ENDPOINT.into(),
            nonce: "8".into(),
            resources: resources.clone(),
            removed_resources: vec!["gone-a".into(), "gone-b".into()],
        };
        let bytes = encode(Response::Delta(response));
        let expected = DeltaDiscoveryResponse {
            system_version_info: "s1".into(),
            resources: resources
                .iter()
                .map(|r| DeltaResource {
                    name: r.name.clone(),
                    version: r.version.clone(),
                    resource: Some(r.body.clone()),
                    ..Default::default()
                })
                .collect(),
            type_url: ENDPOINT.into(),
            removed_resources: vec!["gone-a".into(), "gone-b".into()],
            nonce: "8".into(),
            ..Default::default()
        };
        assert_eq!(bytes.len(), expected.encoded_len());
        assert_eq!(
            DeltaDiscoveryResponse::decode(bytes.as_slice()).ok(),
            Some(expected)
        );
    }

    #[test]
    fn large_bodies_are_sent_from_the_resource_itself() {
        let big = resource(ENDPOINT, "big", 4 * SHARED_BODY);
        let mut frames = Frames::new(Response::Delta(DeltaResponse {
            system_version_info: "s".into(),
            type_url: ENDPOINT.into(),
            nonce: "1".into(),
            resources: vec![resource(ENDPOINT, "small", 10), big.clone()],
            removed_resources: vec![],
        }))
        .expect("small response");
        let mut shared = 0;
        while let Some(chunk) = frames.next_chunk() {
            if chunk.as_ptr() == big.body.value.as_ptr() {
                assert_eq!(chunk.len(), big.body.value.len());
                shared += 1;
            }
        }
        assert_eq!(shared, 1, "the body is not copied");
    }

    #[test]
    fn empty_fields_are_encoded_as_prost_counts_them() {
        let empty = Arc::new(Resource::new(
            "empty",
            Any {
                type_url: ENDPOINT.into(),
                value: vec![],
            },
        ));
        for response in [
            Response::Sotw(SotwResponse {
                version_info: String::new(),
                type_url: ENDPOINT.into(),
                nonce: "1".into(),
                resources: vec![empty.clone()],
            }),
            Response::Delta(DeltaResponse {
                system_version_info: String::new(),
                type_url: ENDPOINT.into(),
                nonce: "1".into(),
                resources: vec![empty.clone()],
                removed_resources: vec![],
            }),
        ] {
            // `encode` checks the prefix length against what was written.
            let sotw = matches!(response, Response::Sotw(_));
            let bytes = encode(response);
            let decoded = if sotw {
                DiscoveryResponse::decode(bytes.as_slice()).map(|r| r.resources[0].clone())
            } else {
                DeltaDiscoveryResponse::decode(bytes.as_slice())
                    .map(|r| r.resources[0].resource.clone().unwrap_or_default())
            };
            assert_eq!(decoded.ok().as_ref(), Some(&empty.body));
        }
    }

    #[test]
    fn an_empty_response_is_one_chunk() {
        let mut frames = Frames::new(Response::Sotw(SotwResponse {
            version_info: "v".into(),
            type_url: CLUSTER.into(),
            nonce: "1".into(),
            resources: vec![],
        }))
        .expect("small response");
        assert!(frames.next_chunk().is_some());
        assert!(frames.next_chunk().is_none());
    }

    #[test]
    fn chunks_stay_near_the_chunk_size() {
        let mut frames = Frames::new(Response::Sotw(SotwResponse {
            version_info: "v".into(),
            type_url: ENDPOINT.into(),
            nonce: "1".into(),
            resources: (0..1000)
                .map(|i| resource(ENDPOINT, &format!("c{i}"), 500))
                .collect(),
        }))
        .expect("small response");
        let mut sizes = Vec::new();
        while let Some(chunk) = frames.next_chunk() {
            sizes.push(chunk.len());
        }
        assert!(sizes.len() > 5, "{sizes:?}");
        let (last, full) = sizes.split_last().unwrap_or((&0, &[]));
        assert!(
            full.iter().all(|&s| (CHUNK - 600..=CHUNK).contains(&s)),
            "{sizes:?}"
        );
        assert!(*last <= CHUNK);
    }
}
