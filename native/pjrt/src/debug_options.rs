//! The compiler options of an XLA plugin, read from the library file.
//!
//! XLA's compiler options (what `XLA_FLAGS` and the compile options'
//! `env_option_overrides` set) are the fields of the protobuf message
//! `xla.DebugOptions`. Protobuf's generated C++ code keeps every `.proto`
//! file's serialized `FileDescriptorProto` in the library's read-only data,
//! so the names and types of those fields, and the values of their enums,
//! can be read from the plugin file itself: without loading it, and for
//! whichever XLA version built it.
//!
//! Reading the options does not decide what to accept: that is the caller's
//! policy.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Error, Result};

/// How `xla/xla.proto`'s descriptor begins: field 1 (name) and field 2
/// (package) of a `FileDescriptorProto`.
const DESCRIPTOR_START: &[u8] = b"\n\rxla/xla.proto\x12\x03xla";
/// The message whose fields are the compiler options.
const MESSAGE: &str = "DebugOptions";
/// The most bytes of descriptor read after its start. `xla.proto`'s is about
/// 60 KB; its length is not stored next to it, so a generous window is read
/// and parsing stops where the descriptor ends.
const DESCRIPTOR_WINDOW: u64 = 4 << 20;
/// Files are scanned in chunks of this size.
const CHUNK: usize = 8 << 20;

/// One field of `xla.DebugOptions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugOptionField {
    pub name: String,
    pub kind: FieldKind,
    /// Repeated fields (lists and maps) hold any number of values.
    pub repeated: bool,
}

/// The protobuf type of a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldKind {
    Bool,
    Int32,
    Int64,
    UInt32,
    UInt64,
    Float,
    Double,
    String,
    Bytes,
    /// An enum, with its values' names and numbers (empty when the enum is
    /// declared in another file).
    Enum(Vec<(String, i32)>),
    /// A message (a map when the field is repeated).
    Message,
}

impl FieldKind {
    /// The protobuf name of the type (`"bool"`, `"int32"`, `"enum"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            FieldKind::Bool => "bool",
            FieldKind::Int32 => "int32",
            FieldKind::Int64 => "int64",
            FieldKind::UInt32 => "uint32",
            FieldKind::UInt64 => "uint64",
            FieldKind::Float => "float",
            FieldKind::Double => "double",
            FieldKind::String => "string",
            FieldKind::Bytes => "bytes",
            FieldKind::Enum(_) => "enum",
            FieldKind::Message => "message",
        }
    }
}

/// The fields of `xla.DebugOptions` in the library at `path`, or `None` when
/// the library carries no descriptor of `xla/xla.proto` (a build with
/// protobuf's lite runtime, or not an XLA plugin).
pub fn debug_option_fields(path: &Path) -> Result<Option<Vec<DebugOptionField>>> {
    let read_error = read_error(path);
    let mut file = File::open(path).map_err(&read_error)?;
    // The bytes carried to the next window are one short of the needle:
    // a match among them would be found there, so the whole window is
    // searched.
    let start = scan_chunks(&mut file, DESCRIPTOR_START.len() - 1, |bytes, _, offset| {
        position(bytes, DESCRIPTOR_START).map(|i| offset + i as u64)
    })
    .map_err(&read_error)?;
    let Some(start) = start else {
        return Ok(None);
    };
    file.seek(SeekFrom::Start(start)).map_err(&read_error)?;
    let mut window = Vec::new();
    file.take(DESCRIPTOR_WINDOW)
        .read_to_end(&mut window)
        .map_err(&read_error)?;
    Ok(parse_file_descriptor(&window))
}

/// The NUL-terminated strings of the library at `path` that look like XLA
/// option names (`xla_` followed by lowercase letters, digits and
/// underscores). XLA registers each flag it reads from `XLA_FLAGS` under
/// such a C string, while its descriptor stores field names without a NUL,
/// so a field whose name is not among these has no flag.
pub fn registered_flag_names(path: &Path) -> Result<BTreeSet<String>> {
    let read_error = read_error(path);
    let mut file = File::open(path).map_err(&read_error)?;
    // A name this long (and its NUL) is found even where a chunk ends in it.
    const LONGEST: usize = 256;
    let mut names = BTreeSet::new();
    scan_chunks(&mut file, LONGEST, |bytes, starts, _| {
        collect_names(bytes, starts, &mut names);
        None::<()>
    })
    .map_err(&read_error)?;
    Ok(names)
}

/// How a failure to read the library at `path` is reported.
fn read_error(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::PluginLoad {
        path: path.display().to_string(),
        reason: format!("{e}"),
    }
}

/// Reads `file` in chunks and calls `scan(bytes, starts, offset)` on each
/// window: `bytes` is what was carried over followed by the chunk just
/// read, `offset` where it begins in the file. `scan` reports what begins
/// in `bytes[..starts]` and may read on to the end of `bytes`; the `reach`
/// bytes from `starts` on are carried to the front of the next window (the
/// last window has `starts` at its end). So each position is offered once,
/// and anything up to `reach + 1` bytes long is seen whole. Stops at the
/// first `Some` that `scan` returns.
fn scan_chunks<T>(
    file: &mut File,
    reach: usize,
    mut scan: impl FnMut(&[u8], usize, u64) -> Option<T>,
) -> std::io::Result<Option<T>> {
    let mut buffer = vec![0u8; CHUNK + reach];
    let mut kept = 0;
    let mut offset = 0u64;
    loop {
        let read = file.read(&mut buffer[kept..])?;
        let end = kept + read;
        let last = read == 0;
        let starts = if last { end } else { end.saturating_sub(reach) };
        if let Some(found) = scan(&buffer[..end], starts, offset) {
            return Ok(Some(found));
        }
        if last {
            return Ok(None);
        }
        buffer.copy_within(starts..end, 0);
        offset += starts as u64;
        kept = end - starts;
    }
}

/// Adds the option names that start before `scan_to` in `bytes`.
fn collect_names(bytes: &[u8], scan_to: usize, names: &mut BTreeSet<String>) {
    let mut at = 0;
    while at < scan_to {
        let Some(i) = bytes[at..scan_to].iter().position(|b| *b == b'x') else {
            return;
        };
        let start = at + i;
        at = start + 1;
        if !bytes[start..].starts_with(b"xla_") {
            continue;
        }
        let rest = &bytes[start..];
        let len = rest
            .iter()
            .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || **b == b'_')
            .count();
        if rest.get(len) == Some(&0) {
            names.insert(text(&rest[..len]));
            at = start + len;
        }
    }
}

fn position(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut at = 0;
    while let Some(i) = haystack[at..].iter().position(|b| *b == first) {
        let start = at + i;
        if haystack[start + 1..].starts_with(rest) {
            return Some(start);
        }
        at = start + 1;
    }
    None
}

/// A protobuf value on the wire.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Reads protobuf fields one by one; `None` where the bytes stop being a
/// well-formed field (the end of a message or of the descriptor).
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Fields { bytes, at: 0 }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u64, Wire<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let tag = self.varint()?;
        let number = tag >> 3;
        if number == 0 {
            return None;
        }
        let value = match tag & 7 {
            0 => Wire::Varint(self.varint()?),
            1 | 5 => {
                let size = if tag & 7 == 1 { 8 } else { 4 };
                self.bytes.get(self.at..self.at + size)?;
                self.at += size;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).ok()?;
                let end = self.at.checked_add(len)?;
                let bytes = self.bytes.get(self.at..end)?;
                self.at = end;
                Wire::Bytes(bytes)
            }
            _ => return None,
        };
        Some((number, value))
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The name (field 1) of a descriptor message.
fn name_of(bytes: &[u8]) -> Option<String> {
    Fields::new(bytes).find_map(|(number, value)| match (number, value) {
        (1, Wire::Bytes(name)) => Some(text(name)),
        _ => None,
    })
}

/// Parses a `FileDescriptorProto` from the start of `bytes` (which may run
/// past its end) and returns the fields of `DebugOptions`.
fn parse_file_descriptor(bytes: &[u8]) -> Option<Vec<DebugOptionField>> {
    let mut message = None;
    let mut enums = HashMap::new();
    for (number, value) in Fields::new(bytes) {
        // FileDescriptorProto has fields 1 to 14: anything else is past it.
        if number > 14 {
            break;
        }
        match (number, value) {
            (4, Wire::Bytes(m)) if message.is_none() && name_of(m).as_deref() == Some(MESSAGE) => {
                message = Some(m)
            }
            (5, Wire::Bytes(e)) => {
                if let Some((name, values)) = parse_enum(e) {
                    enums.insert(format!(".xla.{name}"), values);
                }
            }
            _ => {}
        }
    }
    let message = message?;
    for (number, value) in Fields::new(message) {
        if let (4, Wire::Bytes(e)) = (number, value) {
            if let Some((name, values)) = parse_enum(e) {
                enums.insert(format!(".xla.{MESSAGE}.{name}"), values);
            }
        }
    }
    let fields = Fields::new(message)
        .filter_map(|(number, value)| match (number, value) {
            (2, Wire::Bytes(field)) => parse_field(field, &enums),
            _ => None,
        })
        .collect();
    Some(fields)
}

/// An `EnumDescriptorProto`: its name and `(value name, number)` pairs.
fn parse_enum(bytes: &[u8]) -> Option<(String, Vec<(String, i32)>)> {
    let name = name_of(bytes)?;
    let values = Fields::new(bytes)
        .filter_map(|(number, value)| match (number, value) {
            (2, Wire::Bytes(v)) => {
                let name = name_of(v)?;
                let number = Fields::new(v).find_map(|(n, w)| match (n, w) {
                    // int32 values are sign-extended to 64 bits on the wire.
                    (2, Wire::Varint(x)) => Some(x as i64 as i32),
                    _ => None,
                })?;
                Some((name, number))
            }
            _ => None,
        })
        .collect();
    Some((name, values))
}

/// A `FieldDescriptorProto`.
fn parse_field(
    bytes: &[u8],
    enums: &HashMap<String, Vec<(String, i32)>>,
) -> Option<DebugOptionField> {
    let mut name = None;
    let mut label = 1;
    let mut type_code = 0;
    let mut type_name = String::new();
    for (number, value) in Fields::new(bytes) {
        match (number, value) {
            (1, Wire::Bytes(n)) => name = Some(text(n)),
            (4, Wire::Varint(l)) => label = l,
            (5, Wire::Varint(t)) => type_code = t,
            (6, Wire::Bytes(t)) => type_name = text(t),
            _ => {}
        }
    }
    let kind = match type_code {
        1 => FieldKind::Double,
        2 => FieldKind::Float,
        3 | 16 | 18 => FieldKind::Int64,
        4 | 6 => FieldKind::UInt64,
        5 | 15 | 17 => FieldKind::Int32,
        7 | 13 => FieldKind::UInt32,
        8 => FieldKind::Bool,
        9 => FieldKind::String,
        10 | 11 => FieldKind::Message,
        12 => FieldKind::Bytes,
        14 => FieldKind::Enum(enums.get(&type_name).cloned().unwrap_or_default()),
        _ => return None,
    };
    Some(DebugOptionField {
        name: name?,
        kind,
        // LABEL_REPEATED
        repeated: label == 3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    fn bytes_field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
        varint(out, (number << 3) | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }

    fn int_field(out: &mut Vec<u8>, number: u64, value: i64) {
        varint(out, number << 3);
        varint(out, value as u64);
    }

    fn field(name: &str, label: i64, type_code: i64, type_name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        bytes_field(&mut out, 1, name.as_bytes());
        int_field(&mut out, 3, 1);
        int_field(&mut out, 4, label);
        int_field(&mut out, 5, type_code);
        if !type_name.is_empty() {
            bytes_field(&mut out, 6, type_name.as_bytes());
        }
        out
    }

    fn enum_type(name: &str, values: &[(&str, i64)]) -> Vec<u8> {
        let mut out = Vec::new();
        bytes_field(&mut out, 1, name.as_bytes());
        for (value, number) in values {
            let mut v = Vec::new();
            bytes_field(&mut v, 1, value.as_bytes());
            int_field(&mut v, 2, *number);
            bytes_field(&mut out, 2, &v);
        }
        out
    }

    /// A descriptor of `xla/xla.proto` with another message before
    /// `DebugOptions`, a top-level enum after it, and trailing garbage.
    fn descriptor() -> Vec<u8> {
        let mut other = Vec::new();
        bytes_field(&mut other, 1, b"Other");
        bytes_field(&mut other, 2, &field("not_an_option", 1, 8, ""));
        let mut debug = Vec::new();
        bytes_field(&mut debug, 1, b"DebugOptions");
        bytes_field(&mut debug, 2, &field("xla_flag", 1, 8, ""));
        bytes_field(&mut debug, 2, &field("xla_count", 1, 5, ""));
        bytes_field(&mut debug, 2, &field("xla_big", 1, 3, ""));
        bytes_field(&mut debug, 2, &field("xla_ratio", 1, 2, ""));
        bytes_field(&mut debug, 2, &field("xla_passes", 3, 9, ""));
        let nested = ".xla.DebugOptions.Mode";
        bytes_field(&mut debug, 2, &field("xla_mode", 1, 14, nested));
        bytes_field(&mut debug, 2, &field("xla_level", 1, 14, ".xla.Level"));
        bytes_field(&mut debug, 2, &field("xla_extra", 3, 11, ".xla.X.Entry"));
        bytes_field(
            &mut debug,
            4,
            &enum_type("Mode", &[("MODE_A", 0), ("MODE_B", -1)]),
        );
        let mut file = DESCRIPTOR_START.to_vec();
        bytes_field(&mut file, 3, b"google/protobuf/any.proto");
        bytes_field(&mut file, 4, &other);
        bytes_field(&mut file, 4, &debug);
        bytes_field(
            &mut file,
            5,
            &enum_type("Level", &[("LOW", 1), ("HIGH", 2)]),
        );
        int_field(&mut file, 12, 3);
        file.extend_from_slice(b"\0\0\x07garbage xla_flag\0");
        file
    }

    #[test]
    fn reads_the_fields_of_debug_options() {
        let fields = parse_file_descriptor(&descriptor()).unwrap();
        let kinds: Vec<(&str, &FieldKind, bool)> = fields
            .iter()
            .map(|f| (f.name.as_str(), &f.kind, f.repeated))
            .collect();
        let mode = FieldKind::Enum(vec![("MODE_A".into(), 0), ("MODE_B".into(), -1)]);
        let level = FieldKind::Enum(vec![("LOW".into(), 1), ("HIGH".into(), 2)]);
        assert_eq!(
            kinds,
            vec![
                ("xla_flag", &FieldKind::Bool, false),
                ("xla_count", &FieldKind::Int32, false),
                ("xla_big", &FieldKind::Int64, false),
                ("xla_ratio", &FieldKind::Float, false),
                ("xla_passes", &FieldKind::String, true),
                ("xla_mode", &mode, false),
                ("xla_level", &level, false),
                ("xla_extra", &FieldKind::Message, true),
            ]
        );
    }

    #[test]
    fn finds_the_descriptor_and_flag_names_in_a_file() {
        let dir = std::env::temp_dir().join(format!("pjrt-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let library = dir.join("lib.so");
        // The descriptor and a name straddle the scanning chunks.
        let mut bytes = vec![0u8; CHUNK - 10];
        bytes.extend_from_slice(b"xla_first_flag\0");
        bytes.extend(vec![7u8; CHUNK - 30]);
        bytes.extend_from_slice(&descriptor());
        bytes.extend_from_slice(b"\0xla_Upper\0xla_open");
        std::fs::write(&library, &bytes).unwrap();
        let fields = debug_option_fields(&library).unwrap().unwrap();
        assert_eq!(fields.len(), 8);
        let names = registered_flag_names(&library).unwrap();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(names, ["xla_first_flag", "xla_flag"]);
        std::fs::write(&library, b"no descriptor here").unwrap();
        assert_eq!(debug_option_fields(&library).unwrap(), None);
        std::fs::remove_dir_all(dir).unwrap();
        assert!(matches!(
            debug_option_fields(Path::new("/nonexistent/lib.so")),
            Err(Error::PluginLoad { .. })
        ));
    }
}
