//! The upstream's XML answers to the recorded operations that have one (CopyObject,
//! UploadPartCopy, DeleteObjects, CompleteMultipartUpload), read into s3s's types, and the XML
//! bodies those requests carry, written from s3s's types. Reading is lenient the way S3 clients
//! are: elements it does not know (a newer field, a vendor's extension) are passed over.

use quick_xml::events::Event;
use quick_xml::Reader;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result};

/// A child of the document's root: its name, its text, and its own children's names and texts
/// (one level: every answer read here is that shallow).
#[derive(Debug, Default)]
struct Node {
    name: String,
    text: String,
    children: Vec<(String, String)>,
}

impl Node {
    fn get(&self, name: &str) -> Option<String> {
        self.children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// The root element's name and its children.
fn read(xml: &[u8]) -> Result<(String, Vec<Node>), String> {
    // Text is kept exactly (a key may start or end with spaces, or have them around an
    // entity): the whitespace between elements is never a field's value.
    let mut reader = Reader::from_reader(xml);
    let (mut root, mut nodes) = (String::new(), Vec::<Node>::new());
    let mut depth = 0usize;
    let mut text = String::new();
    loop {
        let event = reader.read_event().map_err(|e| e.to_string())?;
        match event {
            Event::Start(e) => {
                depth += 1;
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                match depth {
                    1 => root = name,
                    2 => nodes.push(Node {
                        name,
                        ..Node::default()
                    }),
                    3 => nodes
                        .last_mut()
                        .unwrap()
                        .children
                        .push((name, String::new())),
                    _ => {}
                }
                text.clear();
            }
            Event::Empty(e) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                match depth {
                    1 => nodes.push(Node {
                        name,
                        ..Node::default()
                    }),
                    2 => nodes
                        .last_mut()
                        .unwrap()
                        .children
                        .push((name, String::new())),
                    _ => {}
                }
            }
            Event::Text(t) => text.push_str(&t.decode().map_err(|e| e.to_string())?),
            Event::CData(t) => text.push_str(&t.decode().map_err(|e| e.to_string())?),
            Event::GeneralRef(r) => {
                let name = r.decode().map_err(|e| e.to_string())?;
                match r.resolve_char_ref().map_err(|e| e.to_string())? {
                    Some(c) => text.push(c),
                    None => text.push_str(
                        quick_xml::escape::resolve_xml_entity(&name)
                            .ok_or_else(|| format!("unknown entity &{name};"))?,
                    ),
                }
            }
            Event::End(_) => {
                match depth {
                    2 => nodes.last_mut().unwrap().text = std::mem::take(&mut text),
                    3 => {
                        nodes.last_mut().unwrap().children.last_mut().unwrap().1 =
                            std::mem::take(&mut text)
                    }
                    _ => {}
                }
                text.clear();
                depth = depth.saturating_sub(1);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if root.is_empty() {
        return Err("no root element".into());
    }
    Ok((root, nodes))
}

fn bad_answer(what: &str, why: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::InternalError,
        format!("the upstream's answer to {what} could not be read: {why}"),
    )
}

/// An `<Error>` document inside a 200 answer (S3 sends one when a long CopyObject or
/// CompleteMultipartUpload fails after it started answering): that error.
fn error_in(root: &str, nodes: &[Node]) -> Option<S3Error> {
    if root != "Error" {
        return None;
    }
    let field = |n: &str| nodes.iter().find(|x| x.name == n).map(|x| x.text.clone());
    let code = field("Code").unwrap_or_else(|| "InternalError".into());
    let code = S3ErrorCode::from_bytes(code.as_bytes()).unwrap_or(S3ErrorCode::InternalError);
    Some(match field("Message") {
        Some(m) => S3Error::with_message(code, m),
        None => S3Error::new(code),
    })
}

/// The fields of a one-level answer (`<Root><A>..</A><B>..</B></Root>`), by name.
fn flat(what: &str, xml: &[u8]) -> S3Result<impl Fn(&str) -> Option<String>> {
    let (root, nodes) = read(xml).map_err(|e| bad_answer(what, e))?;
    if let Some(e) = error_in(&root, &nodes) {
        return Err(e);
    }
    Ok(move |name: &str| {
        nodes
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.text.clone())
    })
}

fn etag_of(v: Option<String>) -> Option<ETag> {
    v.and_then(|t| ETag::parse_http_header(t.as_bytes()).ok())
}

fn time_of(v: Option<String>) -> Option<Timestamp> {
    v.and_then(|t| Timestamp::parse(TimestampFormat::DateTime, &t).ok())
}

pub(super) fn copy_object_result(xml: &[u8]) -> S3Result<CopyObjectResult> {
    let f = flat("CopyObject", xml)?;
    Ok(CopyObjectResult {
        e_tag: etag_of(f("ETag")),
        last_modified: time_of(f("LastModified")),
        checksum_crc32: f("ChecksumCRC32"),
        checksum_crc32c: f("ChecksumCRC32C"),
        checksum_crc64nvme: f("ChecksumCRC64NVME"),
        checksum_sha1: f("ChecksumSHA1"),
        checksum_sha256: f("ChecksumSHA256"),
        checksum_type: f("ChecksumType").map(ChecksumType::from),
    })
}

pub(super) fn copy_part_result(xml: &[u8]) -> S3Result<CopyPartResult> {
    let f = flat("UploadPartCopy", xml)?;
    Ok(CopyPartResult {
        e_tag: etag_of(f("ETag")),
        last_modified: time_of(f("LastModified")),
        checksum_crc32: f("ChecksumCRC32"),
        checksum_crc32c: f("ChecksumCRC32C"),
        checksum_crc64nvme: f("ChecksumCRC64NVME"),
        checksum_sha1: f("ChecksumSHA1"),
        checksum_sha256: f("ChecksumSHA256"),
    })
}

/// CompleteMultipartUpload's answer; its header-borne fields (version, encryption) travel in
/// the upstream's headers, handed back unchanged.
pub(super) fn complete_result(xml: &[u8]) -> S3Result<CompleteMultipartUploadOutput> {
    let f = flat("CompleteMultipartUpload", xml)?;
    Ok(CompleteMultipartUploadOutput {
        location: f("Location"),
        bucket: f("Bucket"),
        key: f("Key"),
        e_tag: etag_of(f("ETag")),
        checksum_crc32: f("ChecksumCRC32"),
        checksum_crc32c: f("ChecksumCRC32C"),
        checksum_crc64nvme: f("ChecksumCRC64NVME"),
        checksum_sha1: f("ChecksumSHA1"),
        checksum_sha256: f("ChecksumSHA256"),
        checksum_type: f("ChecksumType").map(ChecksumType::from),
        ..Default::default()
    })
}

pub(super) fn delete_result(xml: &[u8]) -> S3Result<DeleteObjectsOutput> {
    let (root, nodes) = read(xml).map_err(|e| bad_answer("DeleteObjects", e))?;
    if let Some(e) = error_in(&root, &nodes) {
        return Err(e);
    }
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for n in &nodes {
        match n.name.as_str() {
            "Deleted" => deleted.push(DeletedObject {
                key: n.get("Key"),
                version_id: n.get("VersionId"),
                delete_marker: n.get("DeleteMarker").map(|v| v == "true"),
                delete_marker_version_id: n.get("DeleteMarkerVersionId"),
            }),
            "Error" => errors.push(Error {
                key: n.get("Key"),
                version_id: n.get("VersionId"),
                code: n.get("Code"),
                message: n.get("Message"),
            }),
            _ => {}
        }
    }
    Ok(DeleteObjectsOutput {
        deleted: (!deleted.is_empty()).then_some(deleted),
        errors: (!errors.is_empty()).then_some(errors),
        ..Default::default()
    })
}

/// A request's XML body, as s3s writes it.
pub(super) fn body_of<T: s3s::xml::Serialize>(value: &T) -> S3Result<bytes::Bytes> {
    let mut out = Vec::with_capacity(256);
    let mut ser = s3s::xml::Serializer::new(&mut out);
    ser.decl()
        .and_then(|()| value.serialize(&mut ser))
        .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, format!("{e:?}")))?;
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_result_keeps_every_key_and_error_and_passes_over_the_unknown() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Deleted><Key>a &amp; b/&#233;.bin</Key><VersionId>v1</VersionId><Vendor>x</Vendor></Deleted>
  <Deleted><Key>m</Key><DeleteMarker>true</DeleteMarker><DeleteMarkerVersionId>dm</DeleteMarkerVersionId></Deleted>
  <Deleted><Key> spaced </Key></Deleted>
  <Error><Key>c</Key><Code>AccessDenied</Code><Message>no</Message></Error>
  <Extension/>
</DeleteResult>"#;
        let out = delete_result(xml).unwrap();
        let deleted = out.deleted.unwrap();
        assert_eq!(deleted[0].key.as_deref(), Some("a & b/é.bin"));
        assert_eq!(deleted[0].version_id.as_deref(), Some("v1"));
        assert_eq!(deleted[1].delete_marker, Some(true));
        assert_eq!(deleted[1].delete_marker_version_id.as_deref(), Some("dm"));
        assert_eq!(deleted[2].key.as_deref(), Some(" spaced "));
        let errors = out.errors.unwrap();
        assert_eq!(errors[0].key.as_deref(), Some("c"));
        assert_eq!(errors[0].code.as_deref(), Some("AccessDenied"));
    }

    #[test]
    fn an_error_inside_a_200_answer_is_that_error() {
        let xml = b"<Error><Code>SlowDown</Code><Message>later</Message></Error>";
        let e = copy_object_result(xml).unwrap_err();
        assert_eq!(e.code(), &S3ErrorCode::SlowDown);
        assert_eq!(e.message(), Some("later"));
        assert!(complete_result(b"<Error><Code>InternalError</Code></Error>").is_err());
        assert!(delete_result(b"not xml <").is_err());
    }

    #[test]
    fn copy_and_complete_answers_are_read_field_by_field() {
        let xml = br#"<CopyObjectResult><LastModified>2026-11-29T10:00:00.000Z</LastModified><ETag>"abc"</ETag><ChecksumCRC32>AAAAAA==</ChecksumCRC32></CopyObjectResult>"#;
        let r = copy_object_result(xml).unwrap();
        assert_eq!(r.e_tag.unwrap().value(), "abc");
        assert!(r.last_modified.is_some());
        assert_eq!(r.checksum_crc32.as_deref(), Some("AAAAAA=="));
        let xml = br#"<CompleteMultipartUploadResult><Location>http://h/b/k</Location><Bucket>b</Bucket><Key>k</Key><ETag>"e-2"</ETag></CompleteMultipartUploadResult>"#;
        let r = complete_result(xml).unwrap();
        assert_eq!(
            (r.bucket.as_deref(), r.key.as_deref()),
            (Some("b"), Some("k"))
        );
        assert_eq!(r.e_tag.unwrap().value(), "e-2");
    }

    #[test]
    fn request_bodies_are_written_as_s3_reads_them() {
        let delete = Delete {
            objects: vec![ObjectIdentifier {
                key: "a&b".into(),
                version_id: Some("v".into()),
                ..Default::default()
            }],
            quiet: Some(true),
        };
        let text = String::from_utf8(body_of(&delete).unwrap().to_vec()).unwrap();
        assert!(text.contains("<Delete"), "{text}");
        assert!(text.contains("<Key>a&amp;b</Key>"), "{text}");
        assert!(text.contains("<Quiet>true</Quiet>"), "{text}");
    }
}
