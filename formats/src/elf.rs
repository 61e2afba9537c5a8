//! Reads one exported `u32` from an ELF shared object's bytes without
//! loading it: the `plugin_version` a Slurm plugin announces.
//!
//! Slurm finds a plugin's `plugin_version` with `dlsym`, so this looks where
//! the dynamic linker looks: the dynamic symbol table (`.dynsym`, with its
//! string table from `sh_link`), which `strip --strip-all` keeps. The symbol's
//! value is an address in one of the file's sections; its 4 bytes are read
//! from that section's place in the file, in the file's byte order. 32- and
//! 64-bit files of either byte order are read.
//!
//! The `object` crate reads the headers and tables (its low-level ELF reader,
//! read-only, with `unaligned` so any byte slice reads); every offset and
//! size it takes from the file is checked against the file, so bad input
//! gives an error, never a panic. What a Slurm plugin's symbol must be (defined
//! here, 4 bytes, inside its section) is checked here. Behind the feature
//! `elf`: the agent and `spank-gpu`'s tests read plugin files, the plugin's
//! cdylib reads none.

use std::fmt;

use object::elf::{ET_REL, FileHeader32, FileHeader64, SHT_DYNSYM, SHT_NOBITS, SHT_SYMTAB};
use object::read::StringTable;
use object::read::elf::{FileHeader, SectionHeader, SectionTable, Sym};
use object::{Endian, Endianness, SectionIndex};

/// The symbol Slurm reads the plugin's release from (`src/common/plugin.c`,
/// `_verify_syms`).
pub const PLUGIN_VERSION: &str = "plugin_version";

/// Why the symbol's value cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfError {
    /// What is wrong.
    pub kind: ElfErrorKind,
    /// What is wrong, in words.
    pub detail: String,
}

/// What is wrong with the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfErrorKind {
    /// Not an ELF file (no `\x7fELF`, or an unknown class or byte order).
    NotElf,
    /// A header, table or value lies outside the file, or a table has an
    /// entry size this reader does not know.
    Malformed,
    /// No dynamic symbol table: not a shared object.
    NoDynamicSymbols,
    /// The symbol is not in the dynamic symbol table.
    NoSymbol,
    /// The symbol is there but not defined in this file (imported), or its
    /// value is not 4 bytes in a section of the file.
    NotAValue,
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for ElfError {}

fn fail(kind: ElfErrorKind, detail: impl Into<String>) -> ElfError {
    ElfError { kind, detail: detail.into() }
}

/// `object`'s reason, with what was being read: a header, table or value
/// outside the file, or of a size it does not know.
fn malformed(what: &str) -> impl FnOnce(object::read::Error) -> ElfError + '_ {
    move |e| fail(ElfErrorKind::Malformed, format!("{what}: {e}"))
}

/// The value of the `u32` the dynamic symbol `name` points at (Slurm's
/// `plugin_version` is `const uint32_t`, in `.rodata`; one in `.bss` is 0).
///
/// # Errors
/// The bytes are not an ELF file, are malformed or truncated, or have no
/// such symbol defined with a 4-byte value in one of their sections.
pub fn exported_u32(bytes: &[u8], name: &str) -> Result<u32, ElfError> {
    if bytes.len() < 16 || !bytes.starts_with(b"\x7fELF") {
        return Err(fail(ElfErrorKind::NotElf, "not an ELF file"));
    }
    if !matches!(bytes[5], 1 | 2) {
        return Err(fail(ElfErrorKind::NotElf, format!("unknown ELF byte order {}", bytes[5])));
    }
    match bytes[4] {
        1 => exported::<FileHeader32<Endianness>>(bytes, name),
        2 => exported::<FileHeader64<Endianness>>(bytes, name),
        c => Err(fail(ElfErrorKind::NotElf, format!("unknown ELF class {c}"))),
    }
}

fn exported<Elf: FileHeader<Endian = Endianness>>(bytes: &[u8], name: &str) -> Result<u32, ElfError> {
    let header = Elf::parse(bytes).map_err(malformed("the ELF header"))?;
    let endian = header.endian().map_err(malformed("the ELF header"))?;
    // The section headers without their names (`FileHeader::sections` wants
    // a name table, which ELF lets a file go without): the types and links
    // say where the symbols are.
    let headers = header.section_headers(endian, bytes).map_err(malformed("the section headers"))?;
    let sections = SectionTable::<Elf>::new(headers, StringTable::default());
    if sections.is_empty() {
        return Err(fail(ElfErrorKind::NoDynamicSymbols, "no section headers"));
    }
    // An object file has no dynamic table; its own symbols stand in (only for
    // tests on objects; Slurm loads shared objects).
    let object_file = header.e_type(endian) == ET_REL;
    let mut symbols =
        sections.symbols(endian, bytes, SHT_DYNSYM).map_err(malformed("the dynamic symbols"))?;
    if symbols.section() == SectionIndex(0) && object_file {
        symbols = sections.symbols(endian, bytes, SHT_SYMTAB).map_err(malformed("the symbols"))?;
    }
    if symbols.section() == SectionIndex(0) {
        return Err(fail(ElfErrorKind::NoDynamicSymbols, "no dynamic symbol table"));
    }
    let table = sections.section(symbols.section()).map_err(malformed("the symbol table"))?;
    let entsize: u64 = table.sh_entsize(endian).into();
    if usize::try_from(entsize).ok() != Some(size_of::<Elf::Sym>()) {
        return Err(fail(ElfErrorKind::Malformed, format!("symbols of {entsize} bytes")));
    }
    let wanted = name.as_bytes();
    for (index, sym) in symbols.enumerate() {
        // A name outside the string table is no name: skip it, as before.
        if symbols.symbol_name(endian, sym).ok() != Some(wanted) {
            continue;
        }
        // `None`: undefined (imported) or a reserved index (absolute, common).
        let home = symbols.symbol_section(endian, sym, index).map_err(malformed(name))?;
        let Some(home) = home else {
            return Err(fail(ElfErrorKind::NotAValue, format!("{name} is not defined in this file")));
        };
        let size: u64 = sym.st_size(endian).into();
        if size != 0 && size != 4 {
            return Err(fail(ElfErrorKind::NotAValue, format!("{name} is {size} bytes, not 4")));
        }
        let section = sections.section(home).map_err(|_| {
            fail(ElfErrorKind::Malformed, format!("{name} is in section {}, past the last", home.0))
        })?;
        // In an object file a symbol's value is its offset in its section.
        let value: u64 = sym.st_value(endian).into();
        let into = if object_file { Some(value) } else { value.checked_sub(section.sh_addr(endian).into()) };
        let section_size: u64 = section.sh_size(endian).into();
        let Some(into) = into.filter(|o| o.checked_add(4).is_some_and(|end| end <= section_size)) else {
            return Err(fail(ElfErrorKind::NotAValue, format!("{name} lies outside its section")));
        };
        if section.sh_type(endian) == SHT_NOBITS {
            return Ok(0);
        }
        let data = section.data(endian, bytes).map_err(malformed(&format!("{name}'s section")))?;
        let value = usize::try_from(into)
            .ok()
            .and_then(|at| data.get(at..at.checked_add(4)?))
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .ok_or_else(|| fail(ElfErrorKind::Malformed, format!("{name}'s section is outside the file")))?;
        return Ok(endian.read_u32_bytes(value));
    }
    Err(fail(ElfErrorKind::NoSymbol, format!("no {name} symbol")))
}

/// The `plugin_version` a Slurm plugin file announces.
///
/// # Errors
/// As [`exported_u32`].
pub fn plugin_version(bytes: &[u8]) -> Result<u32, ElfError> {
    exported_u32(bytes, PLUGIN_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal shared object as a linker lays one out: the ELF header,
    /// `.rodata` holding `value`, `.dynstr`, `.dynsym` (a null symbol, an
    /// imported one, then `name`), `.bss`, and the section headers.
    fn object(wide: bool, big: bool, name: &str, value: u32, in_bss: bool) -> Vec<u8> {
        let put = |v: &mut Vec<u8>, x: u64, n: usize| {
            let b = x.to_le_bytes();
            let b = &b[..n];
            if big { v.extend(b.iter().rev()) } else { v.extend_from_slice(b) }
        };
        let w = if wide { 8 } else { 4 };
        let ehsize: u64 = if wide { 64 } else { 52 };
        let rodata_addr = 0x2000u64;
        let rodata_off = ehsize;
        let strtab = format!("\0spank_init\0{name}\0").into_bytes();
        let strtab_off = rodata_off + 8;
        let dynsym_off = (strtab_off + strtab.len() as u64).next_multiple_of(8);
        let symsize: u64 = if wide { 24 } else { 16 };
        let dynsym_len = 3 * symsize;
        let shoff = dynsym_off + dynsym_len;
        let shentsize: u64 = if wide { 64 } else { 40 };
        let mut v = Vec::new();
        v.extend_from_slice(b"\x7fELF");
        v.push(if wide { 2 } else { 1 });
        v.push(if big { 2 } else { 1 });
        v.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        put(&mut v, 3, 2); // ET_DYN
        put(&mut v, 62, 2); // e_machine
        put(&mut v, 1, 4); // e_version
        put(&mut v, 0, w); // e_entry
        put(&mut v, 0, w); // e_phoff
        put(&mut v, shoff, w); // e_shoff
        put(&mut v, 0, 4); // e_flags
        put(&mut v, ehsize, 2);
        put(&mut v, 0, 2); // e_phentsize
        put(&mut v, 0, 2); // e_phnum
        put(&mut v, shentsize, 2);
        put(&mut v, 5, 2); // e_shnum
        put(&mut v, 0, 2); // e_shstrndx: no section names, which ELF allows
        assert_eq!(v.len() as u64, ehsize);
        put(&mut v, u64::from(value), 4);
        put(&mut v, 0xdead_beef, 4);
        v.extend_from_slice(&strtab);
        v.resize(usize::try_from(dynsym_off).unwrap(), 0);
        let sym = |v: &mut Vec<u8>, name: u64, value: u64, shndx: u64| {
            if wide {
                put(v, name, 4);
                v.push(0x11);
                v.push(0);
                put(v, shndx, 2);
                put(v, value, 8);
                put(v, 4, 8);
            } else {
                put(v, name, 4);
                put(v, value, 4);
                put(v, 4, 4);
                v.push(0x11);
                v.push(0);
                put(v, shndx, 2);
            }
        };
        sym(&mut v, 0, 0, 0);
        sym(&mut v, 1, 0, 0); // spank_init, imported
        let (value_at, shndx) = if in_bss { (0x3000, 4) } else { (rodata_addr, 1) };
        sym(&mut v, 12, value_at, shndx);
        let sh = |v: &mut Vec<u8>, kind: u64, addr: u64, off: u64, size: u64, link: u64, entsize: u64| {
            put(v, 0, 4);
            put(v, kind, 4);
            put(v, 0, w);
            put(v, addr, w);
            put(v, off, w);
            put(v, size, w);
            put(v, link, 4);
            put(v, 0, 4);
            put(v, 8, w);
            put(v, entsize, w);
        };
        sh(&mut v, 0, 0, 0, 0, 0, 0);
        sh(&mut v, 1, rodata_addr, rodata_off, 8, 0, 0); // .rodata
        sh(&mut v, 3, 0, strtab_off, strtab.len() as u64, 0, 0); // .dynstr
        sh(&mut v, 11, 0, dynsym_off, dynsym_len, 2, symsize); // .dynsym
        sh(&mut v, 8, 0x3000, 0, 16, 0, 0); // .bss
        v
    }

    #[test]
    fn what_gcc_builds() {
        // formats/tests/fixtures/elf/README.md: stripped 64-bit, unstripped 32-bit.
        for bytes in [
            &include_bytes!("../tests/fixtures/elf/plugin-x86_64.so")[..],
            &include_bytes!("../tests/fixtures/elf/plugin-i386.so")[..],
        ] {
            assert_eq!(plugin_version(bytes), Ok(0x1a_0505));
            // At any alignment (the bytes of a file read into a buffer at an odd address).
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(bytes);
            assert_eq!(plugin_version(&shifted[1..]), Ok(0x1a_0505));
            // `const char plugin_type[] = "spank"`: 6 bytes, not a u32.
            assert_eq!(exported_u32(bytes, "plugin_type").unwrap_err().kind, ElfErrorKind::NotAValue);
        }
    }

    #[test]
    fn every_class_and_byte_order() {
        for wide in [false, true] {
            for big in [false, true] {
                let o = object(wide, big, PLUGIN_VERSION, 0x1a_0505, false);
                assert_eq!(plugin_version(&o), Ok(0x1a_0505), "wide {wide} big {big}");
                let o = object(wide, big, PLUGIN_VERSION, 0, true);
                assert_eq!(plugin_version(&o), Ok(0), "in .bss: wide {wide} big {big}");
            }
        }
    }

    #[test]
    fn another_symbol_or_an_imported_one_is_not_the_version() {
        let o = object(true, false, "plugin_versio", 7, false);
        assert_eq!(plugin_version(&o).unwrap_err().kind, ElfErrorKind::NoSymbol);
        let e = exported_u32(&o, "spank_init").unwrap_err();
        assert_eq!(e.kind, ElfErrorKind::NotAValue, "{e}");
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        assert_eq!(plugin_version(b"").unwrap_err().kind, ElfErrorKind::NotElf);
        assert_eq!(plugin_version(b"#!/bin/sh\necho slurm 26.05\n").unwrap_err().kind, ElfErrorKind::NotElf);
        let mut bad_class = object(true, false, PLUGIN_VERSION, 1, false);
        bad_class[4] = 3;
        assert_eq!(plugin_version(&bad_class).unwrap_err().kind, ElfErrorKind::NotElf);
        let good = object(true, false, PLUGIN_VERSION, 0x18_0b05, false);
        // Every truncation, and every byte flipped in turn: an answer or an
        // error, never a panic or a read past the end.
        for n in 0..good.len() {
            let _ = plugin_version(&good[..n]);
        }
        // Cut inside the .dynsym header (the last but one).
        let cut = &good[..good.len() - 64 - 1];
        assert_eq!(plugin_version(cut).unwrap_err().kind, ElfErrorKind::Malformed);
        for i in 0..good.len() {
            for x in [0x00, 0xff, 0x80] {
                let mut b = good.clone();
                b[i] ^= x;
                let _ = plugin_version(&b);
            }
        }
        // A pseudo-random file behind a valid-looking header.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut noise = good[..16].to_vec();
        for _ in 0..4096 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            noise.push(seed.to_le_bytes()[0]);
        }
        assert!(plugin_version(&noise).is_err());
    }

    #[test]
    fn no_dynamic_symbols() {
        let mut o = object(true, false, PLUGIN_VERSION, 1, false);
        // Make .dynsym a plain PROGBITS section.
        let shoff = usize::try_from(u64::from_le_bytes(o[0x28..0x30].try_into().unwrap())).unwrap();
        o[shoff + 3 * 64 + 4] = 1;
        assert_eq!(plugin_version(&o).unwrap_err().kind, ElfErrorKind::NoDynamicSymbols);
    }
}
