//! Reads a trace file into text, gunzipping when the content starts with the gzip magic
//! bytes (the extension is not trusted).

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::error::WorkloadError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whole file as UTF-8 text, decompressed if it is gzip.
pub fn read_text(path: &Path) -> Result<String, WorkloadError> {
    let bytes = std::fs::read(path).map_err(|e| WorkloadError::io(path, e))?;
    let raw = if bytes.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::with_capacity(bytes.len() * 8);
        MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(|cause| WorkloadError::Gzip {
                path: path.to_path_buf(),
                cause,
            })?;
        out
    } else {
        bytes
    };
    String::from_utf8(raw).map_err(|e| {
        let line = line_of(
            &String::from_utf8_lossy(e.as_bytes()),
            e.utf8_error().valid_up_to(),
        );
        WorkloadError::Parse {
            path: path.to_path_buf(),
            line,
            msg: "not valid UTF-8".into(),
        }
    })
}

/// 1-based line number of a byte offset.
pub fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
