//! The rows of a binary `COPY` (PostgreSQL's "binary format" of COPY, its arrays as `array_send`
//! writes them), encoded straight into one buffer. A job's file records are a dozen arrays of ~77
//! elements; encoding them through `BinaryCopyInWriter` and `ToSql` (a closure, a reservation and
//! a length patched afterwards per element) was a fifth of a pusher's time (bench/NOTES.md,
//! session 54). The encoding is checked against postgres-types' own, byte for byte.

/// Element types of the arrays a push sends, by their PostgreSQL oid.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Elem {
    Bytea = 17,
    Char = 18,
    Int8 = 20,
    Int2 = 21,
}

/// A value that is one array element.
pub(crate) trait Element: Copy {
    fn put(self, buf: &mut Vec<u8>);
}

impl Element for &[u8] {
    fn put(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&len(self.len()).to_be_bytes());
        buf.extend_from_slice(self);
    }
}

impl Element for i64 {
    fn put(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&8i32.to_be_bytes());
        buf.extend_from_slice(&self.to_be_bytes());
    }
}

impl Element for i16 {
    fn put(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&2i32.to_be_bytes());
        buf.extend_from_slice(&self.to_be_bytes());
    }
}

impl Element for i8 {
    fn put(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&1i32.to_be_bytes());
        buf.push(self as u8);
    }
}

fn len(n: usize) -> i32 {
    // A field or element over 1 GB is refused by PostgreSQL anyway; paths and hashes are small.
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// One COPY's data: the header, rows, and the trailer [`CopyRows::finish`] adds.
pub(crate) struct CopyRows {
    buf: Vec<u8>,
}

impl CopyRows {
    pub fn new() -> Self {
        let mut buf = Vec::with_capacity(1 << 16);
        buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
        buf.extend_from_slice(&0i32.to_be_bytes()); // flags
        buf.extend_from_slice(&0i32.to_be_bytes()); // header extension
        CopyRows { buf }
    }

    /// Starts a row of `fields` fields.
    pub fn row(&mut self, fields: i16) {
        self.buf.extend_from_slice(&fields.to_be_bytes());
    }

    pub fn int8(&mut self, v: i64) {
        v.put(&mut self.buf);
    }

    /// A one-dimensional array field (lower bound 1, as postgres-types sends one, empty too).
    pub fn array<T: Element>(
        &mut self,
        elem: Elem,
        items: impl ExactSizeIterator<Item = Option<T>>,
    ) {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0i32.to_be_bytes()); // the field's length, below
        self.buf.extend_from_slice(&1i32.to_be_bytes()); // dimensions
        let flags = self.buf.len();
        self.buf.extend_from_slice(&0i32.to_be_bytes()); // has nulls, below
        self.buf.extend_from_slice(&(elem as i32).to_be_bytes());
        self.buf.extend_from_slice(&len(items.len()).to_be_bytes());
        self.buf.extend_from_slice(&1i32.to_be_bytes()); // lower bound
        let mut nulls = false;
        for item in items {
            match item {
                Some(v) => v.put(&mut self.buf),
                None => {
                    nulls = true;
                    self.buf.extend_from_slice(&(-1i32).to_be_bytes());
                }
            }
        }
        self.buf[flags..flags + 4].copy_from_slice(&i32::from(nulls).to_be_bytes());
        let field = len(self.buf.len() - at - 4);
        self.buf[at..at + 4].copy_from_slice(&field.to_be_bytes());
    }

    /// The data, with the trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.extend_from_slice(&(-1i16).to_be_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres::types::{ToSql, Type};

    /// What postgres-types sends for `v` as a field: its length, then its bytes.
    fn theirs(v: &dyn ToSql, ty: &Type) -> Vec<u8> {
        let mut b = bytes::BytesMut::new();
        let null = v.to_sql_checked(ty, &mut b).unwrap();
        assert!(matches!(null, postgres::types::IsNull::No));
        let mut out = (b.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&b);
        out
    }

    fn ours(f: impl FnOnce(&mut CopyRows)) -> Vec<u8> {
        let mut c = CopyRows { buf: Vec::new() };
        f(&mut c);
        c.buf
    }

    #[test]
    fn arrays_are_encoded_as_postgres_types_encodes_them() {
        let paths: Vec<Option<&[u8]>> = vec![Some(b"/a"), None, Some(b""), Some(&[0xff; 300])];
        assert_eq!(
            ours(|c| c.array(Elem::Bytea, paths.iter().copied())),
            theirs(&paths, &Type::BYTEA_ARRAY)
        );
        let full: Vec<Option<&[u8]>> = vec![Some(b"x"), Some(b"yz")];
        assert_eq!(
            ours(|c| c.array(Elem::Bytea, full.iter().copied())),
            theirs(&full, &Type::BYTEA_ARRAY)
        );
        let ints: Vec<Option<i64>> = vec![Some(-1), None, Some(i64::MAX)];
        assert_eq!(
            ours(|c| c.array(Elem::Int8, ints.iter().copied())),
            theirs(&ints, &Type::INT8_ARRAY)
        );
        let roles: Vec<i8> = vec![b'i' as i8, b'o' as i8, -3];
        assert_eq!(
            ours(|c| c.array(Elem::Char, roles.iter().map(|&r| Some(r)))),
            theirs(&roles, &Type::CHAR_ARRAY)
        );
        let ops: Vec<i16> = vec![1, 6, i16::MIN];
        assert_eq!(
            ours(|c| c.array(Elem::Int2, ops.iter().map(|&o| Some(o)))),
            theirs(&ops, &Type::INT2_ARRAY)
        );
        let empty: Vec<Option<i64>> = Vec::new();
        assert_eq!(
            ours(|c| c.array(Elem::Int8, empty.iter().copied())),
            theirs(&empty, &Type::INT8_ARRAY)
        );
        assert_eq!(ours(|c| c.int8(42)), theirs(&42i64, &Type::INT8));
    }

    #[test]
    fn a_copy_has_the_binary_header_and_trailer() {
        let mut c = CopyRows::new();
        c.row(1);
        c.int8(7);
        let data = c.finish();
        assert_eq!(&data[..11], b"PGCOPY\n\xff\r\n\0");
        assert_eq!(data.len(), 11 + 8 + 2 + 4 + 8 + 2);
        assert_eq!(&data[data.len() - 2..], &[0xff, 0xff]);
    }
}
