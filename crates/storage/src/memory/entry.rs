//! One key of the memory index as one allocation: a 20-byte header, then the key, then the
//! value. The rare parts of a record (an expiry deadline, a fencing token, a version that does
//! not pack) live in a separately boxed [`Extra`], whose pointer sits between the header and
//! the key only when the header says so.
//!
//! ```text
//! ms:u64 tag:u32 key_len:u32 value_len:u32 [extra:*Extra] key value      (byte-packed, align 1)
//! tag = counter (bits 0..17) | node index (bits 17..24) | HAS_EXTRA (bit 24)
//! ```
//!
//! This is the one place in the crate with `unsafe`: raw allocation and reads of the packed
//! layout. [`Entry`] owns its allocation like a `Box`; [`KeyRef`] is a non-owning pointer to
//! the same allocation that the ordered index keeps (valid while its entry is in the hash
//! index; `memory.rs` keeps the two indexes in step).

use std::alloc::{Layout, alloc, dealloc};
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::ptr::NonNull;

use crate::hlc::Hlc;

const HEADER: usize = 20;
const EXTRA_PTR: usize = std::mem::size_of::<usize>();
const COUNTER_BITS: u32 = 17;
const COUNTER_MASK: u32 = (1 << COUNTER_BITS) - 1;
const NODE_SHIFT: u32 = COUNTER_BITS;
const NODE_MASK: u32 = 0x7f;
const HAS_EXTRA: u32 = 1 << 24;

/// Node indexes below this are kept in the header; the others in [`Extra::version`].
pub(super) const INLINE_NODES: usize = NODE_MASK as usize;

/// The parts of a record most keys do not have.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Extra {
    /// 0 = no deadline.
    pub expires_at_ms: u64,
    pub fencing: Option<Hlc>,
    /// The version, when its counter or node index does not fit the header.
    pub version: Option<Hlc>,
    /// A sliding time to live, ms; 0 = none.
    pub slide_ms: u64,
}

impl Extra {
    fn is_empty(&self) -> bool {
        self.expires_at_ms == 0 && self.fencing.is_none() && self.version.is_none() && self.slide_ms == 0
    }
}

/// Lengths of a key or value that do not fit the header (4 GiB and more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooLong;

/// One key, its value and version, owned.
pub(super) struct Entry(NonNull<u8>);

// SAFETY: an `Entry` owns its allocation (and its `Extra`) exclusively, like a `Box<[u8]>`.
unsafe impl Send for Entry {}
unsafe impl Sync for Entry {}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key())
            .field("value_len", &self.value().len())
            .finish_non_exhaustive()
    }
}

fn layout(size: usize) -> Layout {
    // Align 1 and a non-zero size (the header): cannot fail for sizes that fit memory.
    Layout::from_size_align(size, 1).unwrap_or(Layout::new::<[u8; HEADER]>())
}

impl Entry {
    /// A new entry for `key` holding `value` at `version`, whose node is interned as `node`.
    pub(super) fn new(
        key: &[u8],
        value: &[u8],
        version: &Hlc,
        node: usize,
        expires_at_ms: u64,
        fencing: Option<&Hlc>,
        slide_ms: u64,
    ) -> Result<Entry, TooLong> {
        let key_len = u32::try_from(key.len()).map_err(|_| TooLong)?;
        let value_len = u32::try_from(value.len()).map_err(|_| TooLong)?;
        let packs = version.counter <= COUNTER_MASK && node < INLINE_NODES;
        let mut tag = if packs {
            version.counter | ((node as u32) << NODE_SHIFT)
        } else {
            0
        };
        let extra = Extra {
            expires_at_ms,
            fencing: fencing.cloned(),
            version: (!packs).then(|| version.clone()),
            slide_ms,
        };
        let extra = (!extra.is_empty()).then(|| Box::new(extra));
        if extra.is_some() {
            tag |= HAS_EXTRA;
        }
        let ms = version.ms;
        let size = HEADER + if extra.is_some() { EXTRA_PTR } else { 0 } + key.len() + value.len();
        let layout = layout(size);
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        let entry = Entry(ptr);
        // SAFETY: the allocation is `size` bytes: header, optional pointer, key, value.
        unsafe {
            let p = ptr.as_ptr();
            p.cast::<[u8; 8]>().write_unaligned(ms.to_le_bytes());
            p.add(8).cast::<[u8; 4]>().write_unaligned(tag.to_le_bytes());
            p.add(12).cast::<[u8; 4]>().write_unaligned(key_len.to_le_bytes());
            p.add(16).cast::<[u8; 4]>().write_unaligned(value_len.to_le_bytes());
            let mut at = HEADER;
            if let Some(x) = extra {
                p.add(at).cast::<*mut Extra>().write_unaligned(Box::into_raw(x));
                at += EXTRA_PTR;
            }
            std::ptr::copy_nonoverlapping(key.as_ptr(), p.add(at), key.len());
            std::ptr::copy_nonoverlapping(value.as_ptr(), p.add(at + key.len()), value.len());
        }
        Ok(entry)
    }

    fn u32_at(&self, offset: usize) -> u32 {
        // SAFETY: offsets below HEADER are inside every entry's allocation.
        u32::from_le_bytes(unsafe { self.0.as_ptr().add(offset).cast::<[u8; 4]>().read_unaligned() })
    }

    pub(super) fn ms(&self) -> u64 {
        // SAFETY: the first 8 bytes are the header's `ms`.
        u64::from_le_bytes(unsafe { self.0.as_ptr().cast::<[u8; 8]>().read_unaligned() })
    }

    fn tag(&self) -> u32 {
        self.u32_at(8)
    }

    pub(super) fn counter(&self) -> u32 {
        self.tag() & COUNTER_MASK
    }

    /// The interned node index (meaningless when [`Extra::version`] is set).
    pub(super) fn node(&self) -> usize {
        ((self.tag() >> NODE_SHIFT) & NODE_MASK) as usize
    }

    fn body(&self) -> usize {
        HEADER + if self.tag() & HAS_EXTRA != 0 { EXTRA_PTR } else { 0 }
    }

    fn size(&self) -> usize {
        self.body() + self.u32_at(12) as usize + self.u32_at(16) as usize
    }

    pub(super) fn extra(&self) -> Option<&Extra> {
        if self.tag() & HAS_EXTRA == 0 {
            return None;
        }
        // SAFETY: with HAS_EXTRA the pointer after the header is a live `Box<Extra>` we own.
        unsafe { Some(&*self.0.as_ptr().add(HEADER).cast::<*const Extra>().read_unaligned()) }
    }

    pub(super) fn key(&self) -> &[u8] {
        // SAFETY: `key_len` bytes follow the header (and the extra pointer).
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(self.body()), self.u32_at(12) as usize) }
    }

    pub(super) fn value(&self) -> &[u8] {
        let at = self.body() + self.u32_at(12) as usize;
        // SAFETY: `value_len` bytes follow the key.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(at), self.u32_at(16) as usize) }
    }

    pub(super) fn expires_at_ms(&self) -> u64 {
        self.extra().map_or(0, |x| x.expires_at_ms)
    }

    /// The non-owning pointer the ordered index keeps.
    pub(super) fn key_ref(&self) -> KeyRef {
        KeyRef(self.0)
    }

    /// Replaces the version and value in place when the new record takes exactly the same
    /// bytes and neither record has an [`Extra`] (the common overwrite); `false` otherwise.
    pub(super) fn overwrite(&mut self, value: &[u8], ms: u64, counter: u32, node: usize) -> bool {
        if self.tag() & HAS_EXTRA != 0
            || counter > COUNTER_MASK
            || node >= INLINE_NODES
            || value.len() != self.u32_at(16) as usize
        {
            return false;
        }
        let tag = counter | ((node as u32) << NODE_SHIFT);
        let at = self.body() + self.u32_at(12) as usize;
        // SAFETY: same layout as before (no extra, same lengths); we own the allocation.
        unsafe {
            let p = self.0.as_ptr();
            p.cast::<[u8; 8]>().write_unaligned(ms.to_le_bytes());
            p.add(8).cast::<[u8; 4]>().write_unaligned(tag.to_le_bytes());
            std::ptr::copy_nonoverlapping(value.as_ptr(), p.add(at), value.len());
        }
        true
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let size = self.size();
        // SAFETY: we own the allocation and its extra box; neither is used after this.
        unsafe {
            if self.tag() & HAS_EXTRA != 0 {
                let x = self.0.as_ptr().add(HEADER).cast::<*mut Extra>().read_unaligned();
                drop(Box::from_raw(x));
            }
            dealloc(self.0.as_ptr(), layout(size));
        }
    }
}

/// A key as the ordered index sees it: a pointer into an [`Entry`] owned by the hash index.
#[derive(Clone, Copy)]
pub(super) struct KeyRef(NonNull<u8>);

// SAFETY: a `KeyRef` only reads an entry that the same lock-protected index owns.
unsafe impl Send for KeyRef {}
unsafe impl Sync for KeyRef {}

impl KeyRef {
    pub(super) fn key(&self) -> &[u8] {
        // SAFETY: the memory index removes a `KeyRef` before freeing its entry, so the pointer
        // is live whenever the ordered index reads it; reading the key is what `Entry` does.
        let entry = std::mem::ManuallyDrop::new(Entry(self.0));
        let key: &[u8] = entry.key();
        // SAFETY: the key bytes live as long as the entry, which outlives this borrow of self.
        unsafe { std::slice::from_raw_parts(key.as_ptr(), key.len()) }
    }

    /// Starts loading the entry's first bytes into the cache, without waiting for them.
    pub(super) fn touch(&self) {
        // SAFETY: as in `key`: the entry is live while the ordered index holds this pointer. A
        // volatile read is one load the compiler keeps; nothing waits for its value.
        unsafe { std::ptr::read_volatile(self.0.as_ptr()) };
    }

    /// Whether both point to the same entry.
    pub(super) fn same(&self, other: &KeyRef) -> bool {
        self.0 == other.0
    }

    /// The entry this points to (borrowed from its owner).
    pub(super) fn with_entry<T>(&self, f: impl FnOnce(&Entry) -> T) -> T {
        let entry = std::mem::ManuallyDrop::new(Entry(self.0));
        f(&entry)
    }
}

impl Borrow<[u8]> for KeyRef {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

impl PartialEq for KeyRef {
    fn eq(&self, other: &KeyRef) -> bool {
        self.key() == other.key()
    }
}

impl Eq for KeyRef {}

impl PartialOrd for KeyRef {
    fn partial_cmp(&self, other: &KeyRef) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KeyRef {
    fn cmp(&self, other: &KeyRef) -> Ordering {
        self.key().cmp(other.key())
    }
}
