//! Checks a plugin file before `dlopen` sees it.
//!
//! The dynamic loader maps a shared library and trusts its headers: a file
//! cut short (an interrupted copy or download) maps pages past its end, and
//! the first touch of one kills the process with SIGBUS. So the headers are
//! read here first, and every part of the file the loader will map or read
//! (program headers, loaded and dynamic segments, section contents) must lie
//! within the file. On macOS a Mach-O file's magic and load commands are
//! checked the same way; other systems are not checked.
//!
//! `load_global` loads a library a plugin depends on ahead of the plugin
//! (the caller decides which): its symbols become global, and the dynamic
//! loader then finds it by its soname when the plugin asks for it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Why the file cannot be loaded, for `Error::PluginLoad`; `Ok` when its
/// headers are sound (or its format is not one checked here).
pub fn check(path: &Path) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut magic = [0u8; 4];
    if size < 4 || file.read_exact(&mut magic).is_err() {
        return Err(format!(
            "the file has {size} bytes, too few for a shared library"
        ));
    }
    let mut reader = Reader { file, size };
    match magic {
        [0x7f, b'E', b'L', b'F'] => elf::check(&mut reader),
        _ if cfg!(target_os = "macos") => macho::check(&mut reader, magic),
        _ if cfg!(unix) => Err("it is not an ELF shared library (no ELF magic)".into()),
        _ => Ok(()),
    }
}

/// Loads `library` for the life of the process with its symbols global
/// (`RTLD_NOW | RTLD_GLOBAL`), as `dlopen` resolves it: a path (which
/// `check` examines first) or a bare file name that the loader searches
/// for. `Err` is `Error::LibraryLoad` with the loader's or the check's
/// reason.
#[cfg(unix)]
pub fn load_global(library: &str) -> crate::Result<()> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let failed = |reason: String| crate::Error::LibraryLoad {
        library: library.to_string(),
        reason,
    };
    if library.contains('/') {
        check(Path::new(library)).map_err(failed)?;
    }
    // SAFETY: loading a shared library runs its initialisers; the caller
    // names libraries that are written to be loaded this way.
    let loaded = unsafe { Library::open(Some(library), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| failed(e.to_string()))?;
    // Never unloaded: a plugin loaded later may bind to its symbols.
    std::mem::forget(loaded);
    Ok(())
}

/// Other systems have no global symbol scope to add to.
#[cfg(not(unix))]
pub fn load_global(library: &str) -> crate::Result<()> {
    Err(crate::Error::LibraryLoad {
        library: library.to_string(),
        reason: format!("{library}: preloading libraries needs a Unix system"),
    })
}

/// The file with its size; reads fail when they would pass its end.
struct Reader {
    file: File,
    size: u64,
}

impl Reader {
    /// Fails, naming `what`, unless `offset + len` lies within the file.
    fn within(&self, what: &str, offset: u64, len: u64) -> Result<(), String> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(format!(
                "the file is truncated or corrupt: {what} at bytes {offset}..+{len} lies past \
                 its end ({} bytes); copy or download the plugin again",
                self.size
            )),
        }
    }

    fn read(&mut self, what: &str, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        self.within(what, offset, len as u64)?;
        let mut bytes = vec![0u8; len];
        self.file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(|e| format!("could not read {what}: {e}"))?;
        Ok(bytes)
    }
}

/// Fixed-width fields of a header, in the file's byte order.
struct Fields<'a> {
    bytes: &'a [u8],
    little: bool,
}

impl Fields<'_> {
    fn get<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut field = [0u8; N];
        field.copy_from_slice(&self.bytes[at..at + N]);
        if !self.little {
            field.reverse();
        }
        field
    }

    fn u16(&self, at: usize) -> u64 {
        u16::from_le_bytes(self.get(at)).into()
    }

    fn u32(&self, at: usize) -> u64 {
        u32::from_le_bytes(self.get(at)).into()
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.get(at))
    }

    /// A 32-bit or 64-bit word.
    fn word(&self, wide: bool, at: usize) -> u64 {
        if wide {
            self.u64(at)
        } else {
            self.u32(at)
        }
    }
}

mod elf {
    use super::{Fields, Reader};

    const ET_DYN: u64 = 3;
    const PT_LOAD: u64 = 1;
    const PT_DYNAMIC: u64 = 2;
    const SHT_NOBITS: u64 = 8;

    /// `e_machine` of the libraries this process can load, where known.
    const MACHINE: Option<u64> = if cfg!(target_arch = "x86_64") {
        Some(62)
    } else if cfg!(target_arch = "aarch64") {
        Some(183)
    } else if cfg!(target_arch = "x86") {
        Some(3)
    } else if cfg!(target_arch = "arm") {
        Some(40)
    } else if cfg!(target_arch = "riscv64") {
        Some(243)
    } else if cfg!(target_arch = "powerpc64") {
        Some(21)
    } else if cfg!(target_arch = "s390x") {
        Some(22)
    } else {
        None
    };

    /// Offsets of the fields read, for ELF32 and ELF64.
    struct Layout {
        header_size: usize,
        phoff: usize,
        shoff: usize,
        phentsize: usize,
        program_header_size: u64,
        section_header_size: u64,
        // Within a program header.
        p_offset: usize,
        p_filesz: usize,
        p_memsz: usize,
        // Within a section header.
        sh_offset: usize,
        sh_size: usize,
    }

    const ELF32: Layout = Layout {
        header_size: 52,
        phoff: 28,
        shoff: 32,
        phentsize: 42,
        program_header_size: 32,
        section_header_size: 40,
        p_offset: 4,
        p_filesz: 16,
        p_memsz: 20,
        sh_offset: 16,
        sh_size: 20,
    };

    const ELF64: Layout = Layout {
        header_size: 64,
        phoff: 32,
        shoff: 40,
        phentsize: 54,
        program_header_size: 56,
        section_header_size: 64,
        p_offset: 8,
        p_filesz: 32,
        p_memsz: 40,
        sh_offset: 24,
        sh_size: 32,
    };

    pub(super) fn check(file: &mut Reader) -> Result<(), String> {
        let ident = file.read("the ELF identification", 0, 16)?;
        let wide = match ident[4] {
            1 => false,
            2 => true,
            class => return Err(format!("its ELF class {class} is invalid")),
        };
        if wide != cfg!(target_pointer_width = "64") {
            return Err(format!(
                "it is a {}-bit library; this process is {}-bit",
                if wide { 64 } else { 32 },
                usize::BITS
            ));
        }
        let little = match ident[5] {
            1 => true,
            2 => false,
            data => return Err(format!("its ELF byte order {data} is invalid")),
        };
        if little != cfg!(target_endian = "little") {
            return Err("its byte order is not this machine's".into());
        }
        let layout = if wide { &ELF64 } else { &ELF32 };
        let bytes = file.read("the ELF header", 0, layout.header_size)?;
        let header = Fields {
            bytes: &bytes,
            little,
        };
        if header.u16(16) != ET_DYN {
            return Err("it is not a shared library (ELF type is not ET_DYN)".into());
        }
        let machine = header.u16(18);
        if MACHINE.is_some_and(|m| m != machine) {
            return Err(format!(
                "it is built for another processor (ELF machine {machine}); this one is {}",
                std::env::consts::ARCH
            ));
        }
        let phoff = header.word(wide, layout.phoff);
        let phnum = header.u16(layout.phentsize + 2);
        if header.u16(layout.phentsize) != layout.program_header_size || phnum == 0 {
            return Err("its program header table is missing or malformed".into());
        }
        check_segments(file, layout, little, phoff, phnum)?;
        let shoff = header.word(wide, layout.shoff);
        let shentsize = header.u16(layout.phentsize + 4);
        let shnum = header.u16(layout.phentsize + 6);
        if shoff != 0 {
            if shentsize != layout.section_header_size {
                return Err("its section header table is malformed".into());
            }
            check_sections(file, layout, little, shoff, shnum)?;
        }
        Ok(())
    }

    fn check_segments(
        file: &mut Reader,
        layout: &Layout,
        little: bool,
        phoff: u64,
        phnum: u64,
    ) -> Result<(), String> {
        let entry = layout.program_header_size;
        let table = file.read("the program header table", phoff, (phnum * entry) as usize)?;
        let wide = entry == ELF64.program_header_size;
        let mut dynamic = false;
        for (i, bytes) in table.chunks_exact(entry as usize).enumerate() {
            let ph = Fields { bytes, little };
            let kind = ph.u32(0);
            if kind != PT_LOAD && kind != PT_DYNAMIC {
                continue;
            }
            dynamic |= kind == PT_DYNAMIC;
            let offset = ph.word(wide, layout.p_offset);
            let filesz = ph.word(wide, layout.p_filesz);
            if kind == PT_LOAD && filesz > ph.word(wide, layout.p_memsz) {
                return Err(format!("its segment {i} is malformed"));
            }
            let what = if kind == PT_LOAD {
                "a loaded segment"
            } else {
                "the dynamic segment"
            };
            file.within(what, offset, filesz)?;
        }
        if !dynamic {
            return Err("it has no dynamic segment: not a shared library".into());
        }
        Ok(())
    }

    fn check_sections(
        file: &mut Reader,
        layout: &Layout,
        little: bool,
        shoff: u64,
        shnum: u64,
    ) -> Result<(), String> {
        let entry = layout.section_header_size;
        let wide = entry == ELF64.section_header_size;
        // With 0xff00 sections or more, the count is in section 0's size.
        let count = if shnum == 0 {
            let first = file.read("the section header table", shoff, entry as usize)?;
            Fields {
                bytes: &first,
                little,
            }
            .word(wide, layout.sh_size)
        } else {
            shnum
        };
        let total = count
            .checked_mul(entry)
            .filter(|total| *total <= file.size)
            .ok_or_else(|| format!("its section count {count} is impossible"))?;
        let table = file.read("the section header table", shoff, total as usize)?;
        for bytes in table.chunks_exact(entry as usize) {
            let sh = Fields { bytes, little };
            if sh.u32(4) == SHT_NOBITS {
                continue;
            }
            file.within(
                "a section",
                sh.word(wide, layout.sh_offset),
                sh.word(wide, layout.sh_size),
            )?;
        }
        Ok(())
    }
}

mod macho {
    use super::{Fields, Reader};

    const MH_MAGIC_64: [u8; 4] = [0xcf, 0xfa, 0xed, 0xfe];
    const FAT_MAGIC: [u8; 4] = [0xca, 0xfe, 0xba, 0xbe];

    pub(super) fn check(file: &mut Reader, magic: [u8; 4]) -> Result<(), String> {
        match magic {
            MH_MAGIC_64 => check_thin(file, 0),
            FAT_MAGIC => {
                let bytes = file.read("the universal header", 0, 8)?;
                let count = Fields {
                    bytes: &bytes,
                    little: false,
                }
                .u32(4);
                let table = file.read("the architecture table", 8, (count * 20) as usize)?;
                for arch in table.chunks_exact(20) {
                    let arch = Fields {
                        bytes: arch,
                        little: false,
                    };
                    file.within("an architecture's image", arch.u32(8), arch.u32(12))?;
                }
                Ok(())
            }
            _ => Err("it is not a 64-bit Mach-O library (no Mach-O magic)".into()),
        }
    }

    fn check_thin(file: &mut Reader, offset: u64) -> Result<(), String> {
        let bytes = file.read("the Mach-O header", offset, 32)?;
        let commands = Fields {
            bytes: &bytes,
            little: true,
        }
        .u32(20);
        file.within("the load commands", offset + 32, commands)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pjrt-library-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// The test binary itself is a sound ELF file: marked as a shared
    /// library it passes, as an executable it fails on its type, and cut
    /// short it fails on its extent.
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    #[test]
    fn checks_type_and_extent_of_elf_files() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let mut library = me.clone();
        library[16] = 3; // ET_DYN
        library[17] = 0;
        assert_eq!(check(&temp("whole.so", &library)), Ok(()));
        let mut executable = me.clone();
        executable[16] = 2; // ET_EXEC
        let err = check(&temp("exe.so", &executable)).unwrap_err();
        assert!(err.contains("not a shared library"), "{err}");
        for len in [10, 63, 64, 200, library.len() / 2, library.len() - 1] {
            let err = check(&temp("cut.so", &library[..len])).unwrap_err();
            assert!(
                err.contains("truncated") || err.contains("too few"),
                "{len}: {err}"
            );
        }
    }

    #[test]
    fn refuses_files_that_are_not_libraries() {
        assert!(check(&temp("empty.so", b""))
            .unwrap_err()
            .contains("too few"));
        let noise: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
        if cfg!(unix) {
            assert!(check(&temp("noise.so", &noise)).is_err());
        }
        assert!(check(Path::new("/nonexistent/plugin.so")).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn loads_libraries_globally_or_says_why_not() {
        // The C library is loaded already: by name it is found, not reloaded.
        assert_eq!(load_global("libc.so.6"), Ok(()));
        let err = load_global("libexla-no-such-library.so.1").unwrap_err();
        assert!(matches!(err, crate::Error::LibraryLoad { .. }), "{err:?}");
        assert!(
            err.to_string().contains("libexla-no-such-library.so.1"),
            "{err}"
        );
        let err = load_global(temp("empty-global.so", b"").to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("too few"), "{err}");
    }
}
