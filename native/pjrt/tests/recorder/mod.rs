//! What the host-callback tests share: f32 values to and from raw bytes
//! (native byte order), and a callback that records the operands it is
//! handed and answers with `reply(n)`.

use std::sync::Mutex;

use pjrt::host_callback::{ArgView, HostCallback, RetView};

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// The `n` values a `Recorder` answers with: 100, 200, 300, ...
pub fn reply(n: usize) -> Vec<f32> {
    (0..n).map(|i| 100.0 * (i % 1000 + 1) as f32).collect()
}

/// (site, dims, values) of each operand seen.
pub type Seen = Vec<(u32, Vec<i64>, Vec<f32>)>;

/// Records the operands of each site; fills every result with `reply(n)`.
#[derive(Default)]
pub struct Recorder {
    pub seen: Mutex<Seen>,
}

impl HostCallback for Recorder {
    fn call(
        &self,
        site: u32,
        args: &[ArgView<'_>],
        rets: &mut [RetView<'_>],
    ) -> Result<(), String> {
        let mut seen = self.seen.lock().unwrap();
        for arg in args {
            seen.push((site, arg.dims.to_vec(), f32s(arg.bytes)));
        }
        for ret in rets {
            let n = ret.bytes.len() / 4;
            ret.bytes.copy_from_slice(&bytes(&reply(n)));
        }
        Ok(())
    }
}
