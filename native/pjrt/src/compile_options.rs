//! The small slice of `xla.CompileOptionsProto` the bindings send.
//!
//! Plugins abort the process on empty options or on zero replicas or
//! partitions, so these are always encoded and checked here.

use crate::error::{Error, Result};

/// Build options for one compilation. `Client::compile` sets the device
/// ordinal from the device it compiles for.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    /// Device ordinal, or -1 to let the runtime choose.
    pub device_ordinal: i64,
    pub num_replicas: i64,
    pub num_partitions: i64,
    /// Whether XLA's SPMD partitioner splits the program over its
    /// partitions, following the program's sharding annotations. Plugins
    /// refuse more than one partition without it.
    pub use_spmd_partitioning: bool,
    /// Whether Shardy, rather than GSPMD, propagates the shardings and
    /// partitions the program: it reads `sdy.sharding` annotations and
    /// propagates shardings to the results the program leaves open (GSPMD
    /// makes them replicated).
    pub use_shardy_partitioner: bool,
    /// XLA `DebugOptions` fields set by name for this compilation, applied
    /// on top of the plugin's defaults and `XLA_FLAGS`; a later entry wins
    /// over an earlier one of the same name. An unknown name fails the
    /// compilation.
    pub env_option_overrides: Vec<(String, OptionOverride)>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            device_ordinal: -1,
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            env_option_overrides: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// Encodes `CompileOptionsProto { executable_build_options (3):
    /// ExecutableBuildOptionsProto { device_ordinal (1), num_replicas (4),
    /// num_partitions (5), use_spmd_partitioning (6), device_assignment (9),
    /// use_shardy_partitioner (19) } }`.
    ///
    /// A device ordinal of 0 or more also becomes a device assignment
    /// (`DeviceAssignmentProto { replica_count (1), computation_count (2),
    /// computation_devices (3): { replica_device_ids (1) } }`): the ordinal
    /// alone does not move a single-replica program off device 0.
    ///
    /// The overrides become `env_option_overrides` (field 7, a map from an
    /// XLA `DebugOptions` field name to an `OptionOverrideProto { oneof {
    /// string_field (1), bool_field (2), int_field (3), double_field (4) } }`).
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.encode_for(self.device_ordinal)
    }

    /// `encode` with `device_ordinal` in place of the options' own.
    pub(crate) fn encode_for(&self, device_ordinal: i64) -> Result<Vec<u8>> {
        if self.num_replicas < 1 || self.num_partitions < 1 {
            return Err(Error::invalid(format!(
                "num_replicas and num_partitions must be at least 1, got {} and {}",
                self.num_replicas, self.num_partitions
            )));
        }
        if device_ordinal < -1 {
            return Err(Error::invalid(format!(
                "invalid device ordinal {}",
                device_ordinal
            )));
        }
        let mut build = Vec::with_capacity(32);
        put_int_field(&mut build, 1, device_ordinal);
        put_int_field(&mut build, 4, self.num_replicas);
        put_int_field(&mut build, 5, self.num_partitions);
        if self.use_spmd_partitioning {
            put_int_field(&mut build, 6, 1);
        }
        if device_ordinal >= 0 && self.num_replicas == 1 && self.num_partitions == 1 {
            let mut ids = Vec::new();
            put_varint(&mut ids, device_ordinal as u64);
            let mut computation = Vec::new();
            put_bytes_field(&mut computation, 1, &ids);
            let mut assignment = Vec::new();
            put_int_field(&mut assignment, 1, 1);
            put_int_field(&mut assignment, 2, 1);
            put_bytes_field(&mut assignment, 3, &computation);
            put_bytes_field(&mut build, 9, &assignment);
        }
        if self.use_shardy_partitioner {
            put_int_field(&mut build, 19, 1);
        }
        let mut out = Vec::with_capacity(build.len() + 4);
        put_bytes_field(&mut out, 3, &build);
        for (name, value) in &self.env_option_overrides {
            if name.is_empty() {
                return Err(Error::invalid("compile option names must not be empty"));
            }
            let mut entry = Vec::with_capacity(name.len() + 16);
            put_bytes_field(&mut entry, 1, name.as_bytes());
            put_bytes_field(&mut entry, 2, &value.encode());
            put_bytes_field(&mut out, 7, &entry);
        }
        Ok(out)
    }
}

/// The value of one compile option override: an XLA `DebugOptions` field
/// set by name for one compilation.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionOverride {
    String(String),
    Bool(bool),
    Int(i64),
    Double(f64),
}

impl OptionOverride {
    /// Encodes the `OptionOverrideProto` message.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            OptionOverride::String(s) => put_bytes_field(&mut out, 1, s.as_bytes()),
            OptionOverride::Bool(b) => put_int_field(&mut out, 2, i64::from(*b)),
            OptionOverride::Int(i) => put_int_field(&mut out, 3, *i),
            OptionOverride::Double(d) => {
                put_varint(&mut out, (4 << 3) | 1);
                out.extend_from_slice(&d.to_le_bytes());
            }
        }
        out
    }
}

fn put_int_field(out: &mut Vec<u8>, field: u64, value: i64) {
    put_varint(out, field << 3);
    // Negative int64 values are encoded as ten-byte two's complement varints.
    put_varint(out, value as u64);
}

fn put_bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_probed_bytes() {
        let bytes = CompileOptions::default().encode().unwrap();
        let expected = [
            0x1A, 0x0F, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x20,
            0x01, 0x28, 0x01,
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn assigns_the_device() {
        let options = CompileOptions {
            device_ordinal: 1,
            ..CompileOptions::default()
        };
        let expected = [
            0x1A, 0x11, 0x08, 0x01, 0x20, 0x01, 0x28, 0x01, 0x4A, 0x09, 0x08, 0x01, 0x10, 0x01,
            0x1A, 0x03, 0x0A, 0x01, 0x01,
        ];
        assert_eq!(options.encode().unwrap(), expected);
    }

    #[test]
    fn encodes_option_overrides_as_map_entries() {
        let overrides = [
            ("a".to_string(), OptionOverride::Bool(false)),
            ("bc".to_string(), OptionOverride::Int(300)),
            ("d".to_string(), OptionOverride::String("x".into())),
            ("e".to_string(), OptionOverride::Double(1.0)),
        ];
        let bytes = CompileOptions {
            env_option_overrides: overrides.to_vec(),
            ..CompileOptions::default()
        }
        .encode()
        .unwrap();
        let base = CompileOptions::default().encode().unwrap();
        assert_eq!(&bytes[..base.len()], &base[..]);
        let mut expected = vec![0x3A, 0x07, 0x0A, 0x01, b'a', 0x12, 0x02, 0x10, 0x00];
        expected.extend([
            0x3A, 0x09, 0x0A, 0x02, b'b', b'c', 0x12, 0x03, 0x18, 0xAC, 0x02,
        ]);
        expected.extend([0x3A, 0x08, 0x0A, 0x01, b'd', 0x12, 0x03, 0x0A, 0x01, b'x']);
        expected.extend([0x3A, 0x0E, 0x0A, 0x01, b'e', 0x12, 0x09, 0x21]);
        expected.extend(1.0f64.to_le_bytes());
        assert_eq!(&bytes[base.len()..], &expected[..]);
        let empty = CompileOptions {
            env_option_overrides: vec![(String::new(), OptionOverride::Bool(true))],
            ..CompileOptions::default()
        };
        assert!(empty.encode().is_err());
    }

    #[test]
    fn asks_for_spmd_partitioning() {
        let options = CompileOptions {
            num_partitions: 2,
            use_spmd_partitioning: true,
            ..CompileOptions::default()
        };
        let bytes = options.encode().unwrap();
        let base = CompileOptions::default().encode().unwrap();
        // One more field (6 = true) in the build options; partitions 2.
        assert_eq!(bytes.len(), base.len() + 2);
        assert_eq!(bytes[1], base[1] + 2);
        assert_eq!(&bytes[bytes.len() - 4..], [0x28, 0x02, 0x30, 0x01]);
    }

    #[test]
    fn asks_for_shardy() {
        let options = CompileOptions {
            num_partitions: 4,
            use_spmd_partitioning: true,
            use_shardy_partitioner: true,
            ..CompileOptions::default()
        };
        let bytes = options.encode().unwrap();
        // Field 19 (varint) is the two-byte tag 0x98 0x01, then true.
        assert_eq!(
            &bytes[bytes.len() - 7..],
            [0x28, 0x04, 0x30, 0x01, 0x98, 0x01, 0x01]
        );
    }

    #[test]
    fn rejects_zero_replicas_and_partitions() {
        for (r, p) in [(0, 1), (1, 0), (-3, 1)] {
            let options = CompileOptions {
                device_ordinal: -1,
                num_replicas: r,
                num_partitions: p,
                ..CompileOptions::default()
            };
            assert!(matches!(options.encode(), Err(Error::InvalidArgument(_))));
        }
    }
}
