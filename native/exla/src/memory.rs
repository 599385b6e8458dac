//! Device memory statistics of a client (`EXLA.Client.get_memory_statistics/1`).
//!
//! This module knows no resource: the client and executable resources hold
//! a ledger, each buffer resource an entry, and the NIFs that read a
//! client's statistics are in `client`.
//!
//! The plugin's own statistics (`PJRT_Device_MemoryStats`) are used where
//! it implements them. Where it does not (the CPU plugins), each client has
//! a `Ledger` of the bytes held by the buffers this NIF made: every buffer
//! resource carries an `Entry` that adds its bytes when the buffer is made
//! (a transfer from the host, an execution's output, a copy) and removes
//! them exactly once, when the buffer is deleted, donated to an execution,
//! or garbage collected. The counts are atomics, so they are exact however
//! many threads make and free buffers; an entry costs a few atomic
//! operations and no call into the plugin.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rustler::NifMap;

use crate::error::NifResult;

/// Bytes held by a client's buffers, in total and per device, and the
/// most held at once since the client was made (or the peak was reset).
pub struct Ledger {
    allocated: AtomicU64,
    peak: AtomicU64,
    per_device: Box<[AtomicU64]>,
}

impl Ledger {
    pub fn new(devices: usize) -> Arc<Ledger> {
        Arc::new(Ledger {
            allocated: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            per_device: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn add(&self, device: usize, bytes: u64) {
        if let Some(count) = self.per_device.get(device) {
            count.fetch_add(bytes, Ordering::Relaxed);
        }
        let now = self.allocated.fetch_add(bytes, Ordering::AcqRel) + bytes;
        // The sum each addition sees is one the total really had, so the
        // largest of them is the exact peak.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::AcqRel);
        }
    }

    fn remove(&self, device: usize, bytes: u64) {
        if let Some(count) = self.per_device.get(device) {
            count.fetch_sub(bytes, Ordering::Relaxed);
        }
        self.allocated.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The peak restarts from what is held now.
    pub fn reset_peak(&self) {
        self.peak
            .store(self.allocated.load(Ordering::Acquire), Ordering::Release);
    }

    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// Never below what is held now: a reset racing an addition may have
    /// stored an older total.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire).max(self.allocated())
    }

    pub fn on_device(&self, device: usize) -> u64 {
        self.per_device
            .get(device)
            .map_or(0, |count| count.load(Ordering::Acquire))
    }

    /// Records a buffer of `bytes` on `device`; dropping the entry (or
    /// `Entry::release`) removes it.
    pub fn entry(self: &Arc<Self>, device: usize, bytes: u64) -> Entry {
        self.add(device, bytes);
        Entry {
            ledger: self.clone(),
            device,
            bytes,
            held: AtomicBool::new(true),
        }
    }
}

/// One buffer's bytes in a ledger, removed exactly once.
pub struct Entry {
    ledger: Arc<Ledger>,
    device: usize,
    bytes: u64,
    held: AtomicBool,
}

impl Entry {
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The buffer no longer holds its memory (deleted or donated).
    pub fn release(&self) {
        if self.held.swap(false, Ordering::AcqRel) {
            self.ledger.remove(self.device, self.bytes);
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.release();
    }
}

#[derive(NifMap)]
pub struct Statistics {
    allocated: u64,
    peak: u64,
    per_device: std::collections::HashMap<usize, u64>,
}

/// PJRT's status code for a function a plugin does not implement.
const UNIMPLEMENTED: i32 = 12;

/// The plugin's statistics of every device, or `None` where the plugin
/// does not keep them.
fn plugin_statistics(client: &pjrt::Client) -> NifResult<Option<Statistics>> {
    let mut stats = Statistics {
        allocated: 0,
        peak: 0,
        per_device: Default::default(),
    };
    for device in 0..client.devices().len() {
        let reported = match client.memory_stats(device) {
            Ok(reported) => reported,
            Err(pjrt::Error::Pjrt {
                code: UNIMPLEMENTED,
                ..
            })
            | Err(pjrt::Error::Unsupported { .. }) => return Ok(None),
            Err(other) => return Err(other.into()),
        };
        let in_use = u64::try_from(reported.bytes_in_use).unwrap_or(0);
        let peak = reported
            .peak_bytes_in_use
            .and_then(|p| u64::try_from(p).ok())
            .unwrap_or(in_use);
        // The values come from the plugin: a sum past u64 saturates
        // instead of panicking (debug) or wrapping (release).
        stats.allocated = stats.allocated.saturating_add(in_use);
        stats.peak = stats.peak.saturating_add(peak.max(in_use));
        stats.per_device.insert(device, in_use);
    }
    Ok(Some(stats))
}

fn ledger_statistics(ledger: &Ledger, devices: usize) -> Statistics {
    Statistics {
        allocated: ledger.allocated(),
        peak: ledger.peak(),
        per_device: (0..devices)
            .map(|device| (device, ledger.on_device(device)))
            .collect(),
    }
}

/// The statistics of `client`'s devices: the plugin's own, or those of
/// `ledger` where the plugin keeps none. May take the plugin allocator's
/// locks: call it on a dirty scheduler.
pub fn statistics(client: &pjrt::Client, ledger: &Ledger) -> NifResult<Statistics> {
    Ok(match plugin_statistics(client)? {
        Some(stats) => stats,
        None => ledger_statistics(ledger, client.devices().len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_add_and_remove_their_bytes_once() {
        let ledger = Ledger::new(2);
        let a = ledger.entry(0, 100);
        let b = ledger.entry(1, 30);
        assert_eq!((ledger.allocated(), ledger.peak()), (130, 130));
        a.release();
        a.release();
        assert_eq!(ledger.allocated(), 30);
        assert_eq!((ledger.on_device(0), ledger.on_device(1)), (0, 30));
        drop(a);
        assert_eq!(ledger.allocated(), 30);
        drop(b);
        assert_eq!((ledger.allocated(), ledger.peak()), (0, 130));
        ledger.reset_peak();
        assert_eq!(ledger.peak(), 0);
        assert_eq!(ledger.on_device(7), 0);
    }

    /// Threads making and freeing buffers at once leave the exact counts.
    #[test]
    fn counts_are_exact_under_concurrency() {
        let ledger = Ledger::new(2);
        let keep: Vec<Entry> = (0..8).map(|i| ledger.entry(i % 2, 1000)).collect();
        std::thread::scope(|scope| {
            for t in 0..8 {
                let ledger = &ledger;
                scope.spawn(move || {
                    for i in 0..10_000u64 {
                        let entry = ledger.entry(t % 2, i % 97 + 1);
                        if i % 3 == 0 {
                            entry.release();
                        }
                    }
                });
            }
        });
        assert_eq!(ledger.allocated(), 8000);
        assert_eq!((ledger.on_device(0), ledger.on_device(1)), (4000, 4000));
        // At most every thread's largest entry on top of the kept ones.
        assert!(ledger.peak() >= 8000 && ledger.peak() <= 8000 + 8 * 97);
        drop(keep);
        assert_eq!(ledger.allocated(), 0);
    }
}
