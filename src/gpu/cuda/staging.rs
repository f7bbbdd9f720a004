//! A decode step's inputs on their way to the device and its tokens on their way back,
//! through page-locked host memory. The small per-row inputs (sampling, token, position,
//! length, segment slot) lie in one range of the scratch ([`InputLayout`]) and go in one
//! copy; the page table goes in one more, of the columns the step's rows use; the tokens come
//! back in a third. From page-locked memory each is a DMA the driver queues at once. Before,
//! five pageable uploads sent every row's whole table (max_context / page size columns): in a
//! backend sized for 32k contexts, a 4k step at batch 64–128 spent 80–255 µs outside its
//! kernels, now 35–93 µs (BENCHMARKS.md §3.14).

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, PinnedHostSlice};

use super::device::{drv, Gpu, Which};
use crate::gpu::BackendError;
use crate::sampling::SampleRow;

/// Bytes of one `SampleRow` as the kernel reads it (`struct SampleRow` in sample.cu).
pub(crate) const SAMPLE_ROW_BYTES: usize = 24;

/// Where a scratch's per-row inputs lie in its one `inputs` allocation, in bytes: each of
/// `logit_rows` (at least 1) rows' sampling, then each row's token, position, length (0: a padding row) and recurrent
/// segment slot (-1: none), as i32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputLayout {
    pub rows: usize,
    pub logit_rows: usize,
}

impl InputLayout {
    pub fn samp(&self) -> usize {
        0
    }
    pub fn tokens(&self) -> usize {
        self.logit_rows * SAMPLE_ROW_BYTES
    }
    pub fn pos(&self) -> usize {
        self.tokens() + 4 * self.rows
    }
    pub fn lens(&self) -> usize {
        self.pos() + 4 * self.rows
    }
    pub fn seg_slot(&self) -> usize {
        self.lens() + 4 * self.rows
    }
    pub fn bytes(&self) -> usize {
        self.seg_slot() + 4 * self.rows
    }
}

/// One decode row's inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RowInput {
    pub sample: SampleRow,
    pub token: i32,
    pub pos: i32,
    pub len: i32,
    pub seg_slot: i32,
}

impl RowInput {
    /// A graph bucket's row past the step's: no tokens, greedy, no segment.
    pub const PADDING: RowInput = RowInput {
        sample: SampleRow::GREEDY,
        token: 0,
        pos: 0,
        len: 0,
        seg_slot: -1,
    };
}

/// The `SampleRow`'s bytes in the kernel's layout (repr(C): f32, f32, i32, i32, u64).
pub(crate) fn sample_row_bytes(s: &SampleRow) -> [u8; SAMPLE_ROW_BYTES] {
    let mut b = [0u8; SAMPLE_ROW_BYTES];
    b[0..4].copy_from_slice(&s.temperature.to_ne_bytes());
    b[4..8].copy_from_slice(&s.top_p.to_ne_bytes());
    b[8..12].copy_from_slice(&s.top_k.to_ne_bytes());
    b[12..16].copy_from_slice(&s.banned.to_ne_bytes());
    b[16..24].copy_from_slice(&s.key.to_ne_bytes());
    b
}

/// Writes `rows` (row i at index i) into `buf` in `lay`'s layout.
pub(crate) fn write_inputs(buf: &mut [u8], lay: InputLayout, rows: &[RowInput]) {
    let put = |buf: &mut [u8], at: usize, v: i32| buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    for (i, r) in rows.iter().enumerate() {
        let s = lay.samp() + i * SAMPLE_ROW_BYTES;
        buf[s..s + SAMPLE_ROW_BYTES].copy_from_slice(&sample_row_bytes(&r.sample));
        put(buf, lay.tokens() + 4 * i, r.token);
        put(buf, lay.pos() + 4 * i, r.pos);
        put(buf, lay.lens() + 4 * i, r.len);
        put(buf, lay.seg_slot() + 4 * i, r.seg_slot);
    }
}

/// Writes each row's pages into `buf` as a [rows.len()][width] table of i32, padded with page
/// 0 past a row's own (rows past `rows.len()` are not written).
pub(crate) fn write_table(buf: &mut [i32], width: usize, rows: &[&[u32]]) {
    for (dst, pages) in buf.chunks_mut(width).zip(rows) {
        let n = pages.len().min(width);
        for (d, &p) in dst[..n].iter_mut().zip(*pages) {
            *d = p as i32;
        }
        dst[n..].fill(0);
    }
}

/// Where a scratch keeps what `Staging` copies: its `inputs` range (in the staging's
/// layout), its page table of `table_width` columns a row, and its sampled tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StagingTargets {
    pub inputs: u64,
    pub table: u64,
    pub table_width: usize,
    pub tokens: u64,
}

/// The page-locked buffers of one decode scratch, and where they copy to.
pub(crate) struct Staging {
    lay: InputLayout,
    dst: StagingTargets,
    inputs: PinnedHostSlice<u8>,
    /// Up to rows x table_width entries; a step packs its rows at the width it uses.
    table: PinnedHostSlice<i32>,
    out: PinnedHostSlice<i32>,
}

impl Staging {
    /// `dst` must stay allocated as long as the staging is used (the scratch beside it).
    pub fn new(
        ctx: &Arc<CudaContext>,
        lay: InputLayout,
        dst: StagingTargets,
    ) -> Result<Self, BackendError> {
        let table_width = dst.table_width;
        // SAFETY: each buffer is written in full (or in the part a step then copies) before
        // any copy reads it; u8 and i32 are valid for any bits.
        unsafe {
            Ok(Staging {
                lay,
                dst,
                inputs: ctx
                    .alloc_pinned::<u8>(lay.bytes())
                    .map_err(drv("page-locked inputs"))?,
                table: ctx
                    .alloc_pinned::<i32>((lay.rows * table_width).max(1))
                    .map_err(drv("page-locked page table"))?,
                out: ctx
                    .alloc_pinned::<i32>(lay.logit_rows)
                    .map_err(drv("page-locked tokens"))?,
            })
        }
    }

    /// Uploads `rows` (every row of the pass, padding included) into the scratch's inputs,
    /// and the first `pages.len()` rows' pages into its page table: only the columns the
    /// longest uses (columns past a row's pages, and rows past those, keep what they held;
    /// no kernel reads a position past a row's length). The caller makes sure no earlier copy
    /// from these buffers is still in flight (a step ends with `read_tokens`, which waits for
    /// the stream).
    pub fn upload(
        &mut self,
        gpu: &Gpu,
        w: Which,
        rows: &[RowInput],
        pages: &[&[u32]],
    ) -> Result<(), BackendError> {
        let (lay, dst) = (self.lay, self.dst);
        let (table_width, width) = (
            dst.table_width,
            pages.iter().map(|p| p.len()).max().unwrap_or(0),
        );
        if rows.len() > lay.rows || pages.len() > rows.len() || width > table_width {
            return Err(BackendError::Failed(format!(
                "{} rows ({} with pages, {width} of {table_width} columns) for a staging of {}",
                rows.len(),
                pages.len(),
                lay.rows
            )));
        }
        let ib = self
            .inputs
            .as_mut_slice()
            .map_err(drv("page-locked inputs"))?;
        write_inputs(ib, lay, rows);
        let stream = gpu.stream(w).cu_stream();
        // SAFETY: `inputs` is the scratch's allocation of `lay.bytes()` bytes; the source is
        // page-locked and outlives the copy (the step waits for the stream before returning).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst.inputs, &ib[..], stream) }
            .map_err(drv("input copy"))?;
        if width == 0 {
            return Ok(());
        }
        let tb = self
            .table
            .as_mut_slice()
            .map_err(drv("page-locked page table"))?;
        let used = &mut tb[..pages.len() * width];
        write_table(used, width, pages);
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: used.as_ptr().cast(),
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: width * 4,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst.table,
            dstArray: std::ptr::null_mut(),
            dstPitch: table_width * 4,
            WidthInBytes: width * 4,
            Height: pages.len(),
        };
        // SAFETY: the destination is the scratch's table of at least rows x table_width i32
        // (pages.len() <= rows, width <= table_width); the source holds pages.len() x width.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
            .result()
            .map_err(drv("page table copy"))
    }

    /// Reads the scratch's first `n` sampled tokens and waits for the stream.
    pub fn read_tokens(&mut self, gpu: &Gpu, w: Which, n: usize) -> Result<Vec<u32>, BackendError> {
        let ob = self.out.as_mut_slice().map_err(drv("page-locked tokens"))?;
        if n > ob.len() {
            return Err(BackendError::Failed(format!(
                "{n} tokens for a staging of {}",
                ob.len()
            )));
        }
        // SAFETY: the scratch's tokens hold at least n i32 (the scratch's out_tok); the stream is
        // synchronised below before the buffer is read.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut ob[..n],
                self.dst.tokens,
                gpu.stream(w).cu_stream(),
            )
        }
        .map_err(drv("token copy"))?;
        gpu.sync(w)?;
        Ok(ob[..n].iter().map(|&t| t as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_layout_packs_sampling_rows_then_four_i32_columns() {
        let lay = InputLayout {
            rows: 8,
            logit_rows: 8,
        };
        assert_eq!(
            (
                lay.samp(),
                lay.tokens(),
                lay.pos(),
                lay.lens(),
                lay.seg_slot()
            ),
            (0, 192, 224, 256, 288)
        );
        assert_eq!(lay.bytes(), 320);
        // Sampling rows stay 8-byte aligned (their u64 key) and the i32 columns 4-byte.
        assert_eq!(lay.tokens() % 8, 0);
    }

    #[test]
    fn a_sample_row_is_written_in_the_kernels_field_order() {
        let s = SampleRow {
            temperature: 0.5,
            top_p: 0.25,
            top_k: -3,
            banned: 7,
            key: 0x0102_0304_0506_0708,
        };
        let b = sample_row_bytes(&s);
        assert_eq!(f32::from_ne_bytes(b[0..4].try_into().unwrap()), 0.5);
        assert_eq!(f32::from_ne_bytes(b[4..8].try_into().unwrap()), 0.25);
        assert_eq!(i32::from_ne_bytes(b[8..12].try_into().unwrap()), -3);
        assert_eq!(i32::from_ne_bytes(b[12..16].try_into().unwrap()), 7);
        assert_eq!(u64::from_ne_bytes(b[16..24].try_into().unwrap()), s.key);
        // The same bytes as the struct in memory: the kernel reads it as laid out.
        // SAFETY: SampleRow is repr(C), 24 bytes with no padding (f32, f32, i32, i32, u64).
        let raw = unsafe { std::mem::transmute::<SampleRow, [u8; 24]>(s) };
        assert_eq!(raw, b);
    }

    #[test]
    fn rows_land_at_their_index_in_every_column() {
        let lay = InputLayout {
            rows: 3,
            logit_rows: 3,
        };
        let mut buf = vec![0xAAu8; lay.bytes()];
        let a = RowInput {
            sample: SampleRow::GREEDY,
            token: 11,
            pos: 40,
            len: 41,
            seg_slot: 2,
        };
        write_inputs(&mut buf, lay, &[a, RowInput::PADDING, a]);
        let i32_at = |at: usize| i32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
        assert_eq!(
            [lay.tokens(), lay.pos(), lay.lens(), lay.seg_slot()].map(|c| i32_at(c + 8)),
            [11, 40, 41, 2]
        );
        assert_eq!(
            [lay.tokens(), lay.pos(), lay.lens(), lay.seg_slot()].map(|c| i32_at(c + 4)),
            [0, 0, 0, -1],
            "the padding row decodes nothing"
        );
        assert_eq!(
            buf[SAMPLE_ROW_BYTES..2 * SAMPLE_ROW_BYTES],
            sample_row_bytes(&SampleRow::GREEDY)
        );
    }

    #[test]
    fn the_table_is_packed_at_the_width_given_and_zero_past_each_rows_pages() {
        let mut buf = vec![-1i32; 9];
        write_table(&mut buf, 3, &[&[5, 6], &[7, 8, 9], &[]]);
        assert_eq!(buf, vec![5, 6, 0, 7, 8, 9, 0, 0, 0]);
    }
}
