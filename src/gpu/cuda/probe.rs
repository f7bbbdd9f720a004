//! Run-time check for the CUDA libraries. cudarc panics when a library is missing, so this
//! runs before any other cudarc call and turns absence into a clear error.

use crate::gpu::BackendError;

/// Which CUDA libraries the dynamic loader can find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibraryProbe {
    pub driver: bool,
    pub nvrtc: bool,
    pub cublas: bool,
    pub cublaslt: bool,
}

impl LibraryProbe {
    pub fn run() -> Self {
        // SAFETY: these only try to dlopen the library; they call nothing in it.
        unsafe {
            LibraryProbe {
                driver: cudarc::driver::sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
                cublaslt: cudarc::cublaslt::sys::is_culib_present(),
            }
        }
    }

    pub fn all_present(&self) -> bool {
        self.driver && self.nvrtc && self.cublas && self.cublaslt
    }

    /// `Ok` when every library is there, else `Unavailable` naming the missing ones.
    pub fn require(&self) -> Result<(), BackendError> {
        let missing: Vec<&str> = [
            (self.driver, "libcuda (driver)"),
            (self.nvrtc, "libnvrtc"),
            (self.cublas, "libcublas"),
            (self.cublaslt, "libcublasLt"),
        ]
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, n)| *n)
        .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(BackendError::Unavailable(format!(
            "CUDA libraries not found: {}; on a GPU host set LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
             (libcuda.so.1 comes with the NVIDIA driver)",
            missing.join(", ")
        )))
    }
}

/// Probes the libraries; `Ok` when the CUDA backend can start.
pub fn probe_libraries() -> Result<(), BackendError> {
    LibraryProbe::run().require()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_are_named_with_the_library_path_hint() {
        let p = LibraryProbe {
            driver: true,
            nvrtc: false,
            cublas: true,
            cublaslt: false,
        };
        let e = p.require().unwrap_err().to_string();
        assert!(e.contains("libnvrtc") && e.contains("libcublasLt"), "{e}");
        assert!(!e.contains("libcuda (driver)"), "{e}");
        assert!(e.contains("LD_LIBRARY_PATH=/usr/local/cuda/lib64"), "{e}");
        let all = LibraryProbe {
            driver: true,
            nvrtc: true,
            cublas: true,
            cublaslt: true,
        };
        assert!(all.require().is_ok());
    }
}
