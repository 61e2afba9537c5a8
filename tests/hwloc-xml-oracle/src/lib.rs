//! hwloc's XML export (`lstopo --of xml`) read into a [`Topology`]: the
//! hand-written walker the plugin used before GPU table v3, kept only as a
//! **test oracle**. The agent now asks hwloc's object API for the machine
//! (`gpu_node_agent::sources::machine`) and writes it into the GPU table; the plugin
//! reads only the table and links no XML parser. Tests compare the two
//! (`node-agent/tests/table_v3.rs`), and `task-plan`'s tests build their
//! topologies from real XML fixtures with it. Never a normal dependency of
//! a shipped crate: only `[dev-dependencies]`.
//!
//! What the [`Topology`] fields mean is documented in `task_plan::topology`.
//!
//! # Formats
//!
//! All three hwloc XML generations are read by the same walk over `<object>`
//! elements, which does not care where NUMA nodes sit:
//!
//! * hwloc 1.x (`<topology>` without a version): `NUMANode` objects are
//!   parents of packages or cores and I/O trees hang below them; every object
//!   also carries `online_cpuset` and `allowed_cpuset`; packages may be
//!   called `Socket` and caches `Cache`.
//! * hwloc 2.x (`version="2.0"`): NUMA nodes are memory children of the
//!   object they are local to; only the root carries `allowed_cpuset`.
//! * hwloc 3.x (`version="3.0"`): as 2.x, with `id` attributes and a fifth
//!   field in `pci_type`.
//!
//! CPU sets are hwloc bitmaps: comma-separated 32-bit hexadecimal words, most
//! significant first, an empty word meaning zero (`0x000000ff,,0xffffffff`);
//! [`parse_hwloc_bitmap`] reads them.
//!
//! # Untrusted input
//!
//! The XML is a cache file: it may be truncated, stale or hostile. Parsing
//! never panics; input over [`MAX_XML_BYTES`] is refused before it is read, an
//! internal DTD (entity definitions) is refused, the number of XML nodes is
//! capped, the walk is iterative (no recursion on nesting depth), bitmaps are
//! limited to [`MAX_CPU`], and the work is linear in the input. A malformed CPU
//! set is an error; a PCI device whose class or ids cannot be read is skipped.

use std::collections::HashMap;
use std::fmt;

use slurm_formats::cpuset::{CpuSet, MAX_CPU};
use slurm_formats::pci::PciAddr;
use task_plan::topology::{NumaNode, PciGpu, Topology};

/// The largest XML text accepted, in bytes. Real topologies are well under
/// 1 MiB (a 2-socket, 224-thread, 20-PCI-device node is 226 KiB).
pub const MAX_XML_BYTES: usize = 64 << 20;

/// The most XML nodes (elements, attributes' owners, text) the parser builds.
const MAX_XML_NODES: u32 = 8_000_000;

/// The most PUs a `Core` without PU children may contribute from its own cpuset
/// (real cores have 1 to 8 hardware threads).
const MAX_PUS_PER_CORE: usize = 64;

/// Why a topology could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyError {
    /// What is wrong, in words.
    pub reason: String,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad hwloc topology: {}", self.reason)
    }
}

impl std::error::Error for TopologyError {}

fn err(reason: impl Into<String>) -> TopologyError {
    TopologyError { reason: reason.into() }
}

/// Parses an hwloc bitmap: comma-separated 32-bit hex words, most significant
/// first, each with an optional `0x`; an empty word is zero (`0xff,,0x1` has
/// bits 0 and 64-71). An empty string is the empty set.
///
/// # Errors
/// A word that is not 1-8 hex digits, hwloc's infinite form (`0xf...f`), or a
/// bit above [`MAX_CPU`].
pub fn parse_hwloc_bitmap(text: &str) -> Result<CpuSet, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(CpuSet::new());
    }
    // Bits 0..=MAX_CPU need this many 32-bit words; hwloc prints no leading zero words.
    let max_words = (MAX_CPU as usize) / 32 + 1;
    let n = text.split(',').count();
    if n > max_words {
        return Err(format!("{n} words: more than the {max_words} that CPU {MAX_CPU} needs"));
    }
    let mut words = vec![0u64; n.div_ceil(2)];
    for (i, word) in text.split(',').enumerate() {
        let word = word.trim();
        let digits = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")).unwrap_or(word);
        if digits.contains("...") {
            return Err("infinite bitmaps (0xf...f) are not CPU sets".into());
        }
        if digits.is_empty() {
            if word.is_empty() {
                continue;
            }
            return Err(format!("'{word}' has no hex digits"));
        }
        if digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("'{}' is not a 32-bit hex word", word.chars().take(40).collect::<String>()));
        }
        let value = u64::from(u32::from_str_radix(digits, 16).map_err(|e| e.to_string())?);
        if value == 0 {
            continue;
        }
        let index = n - 1 - i; // position of this 32-bit word from the least significant end
        let first_bit = index * 32;
        let highest = first_bit + 63 - value.leading_zeros() as usize;
        if highest > MAX_CPU as usize {
            return Err(format!("bit {highest} is above the limit {MAX_CPU}"));
        }
        if let Some(w) = words.get_mut(index / 2) {
            *w |= value << (32 * (index % 2));
        }
    }
    Ok(CpuSet::from_words(&words))
}

/// The object types that are I/O: they carry no CPU set and are never a locality.
fn is_io_type(kind: &str) -> bool {
    matches!(kind, "Bridge" | "HostBridge" | "PCIBridge" | "PCIDev" | "OSDev" | "Misc")
}

fn bitmap_attr(node: roxmltree::Node<'_, '_>, name: &str) -> Result<Option<CpuSet>, TopologyError> {
    match node.attribute(name) {
        None => Ok(None),
        Some(text) => parse_hwloc_bitmap(text).map(Some).map_err(|e| {
            let kind = node.attribute("type").unwrap_or("?");
            err(format!("{kind} object at byte {}: {name}: {e}", node.range().start))
        }),
    }
}

fn u32_attr(node: roxmltree::Node<'_, '_>, name: &str) -> Option<u32> {
    node.attribute(name).and_then(|s| s.trim().parse().ok())
}

/// `"0302 [10de:2330] [10de:16c0] a1"` (a fifth field in hwloc 3) → (class, vendor, device).
fn parse_pci_type(text: &str) -> Option<(u16, u16, u16)> {
    let mut fields = text.split_whitespace();
    let class = fields.next()?;
    let ids = fields.next()?.strip_prefix('[')?.strip_suffix(']')?;
    let (vendor, device) = ids.split_once(':')?;
    let hex16 = |s: &str| {
        if s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            u16::from_str_radix(s, 16).ok()
        } else {
            None
        }
    };
    Some((hex16(class)?, hex16(vendor)?, hex16(device)?))
}

/// hwloc writes `<!DOCTYPE topology SYSTEM "hwloc2.dtd">`: a reference to an
/// external DTD, which says nothing the walk needs. The parser refuses every
/// DOCTYPE (entity definitions could expand to gigabytes), so an external one
/// in the prolog is blanked out with spaces (byte offsets stay valid); one with
/// an internal subset (`[...]`) is refused.
fn blank_external_doctype(xml: &str) -> Result<std::borrow::Cow<'_, str>, TopologyError> {
    let mut pos = 0;
    loop {
        let rest = xml.get(pos..).unwrap_or("");
        let trimmed = rest.trim_start();
        pos += rest.len() - trimmed.len();
        let skip_to = |end: &str| trimmed.find(end).map(|i| i + end.len());
        let skip = if trimmed.starts_with("<?") {
            skip_to("?>")
        } else if trimmed.starts_with("<!--") {
            skip_to("-->")
        } else if trimmed.starts_with("<!DOCTYPE") {
            let end = skip_to(">").ok_or_else(|| err("XML: unterminated DOCTYPE"))?;
            if trimmed.get(..end).is_some_and(|d| d.contains('[')) {
                return Err(err(
                    "XML: a DOCTYPE with an internal subset (entity definitions) is not accepted",
                ));
            }
            let mut out = String::with_capacity(xml.len());
            out.push_str(xml.get(..pos).unwrap_or(""));
            out.push_str(&" ".repeat(end));
            out.push_str(xml.get(pos + end..).unwrap_or(""));
            return Ok(std::borrow::Cow::Owned(out));
        } else {
            None
        };
        match skip {
            Some(n) => pos += n,
            None => return Ok(std::borrow::Cow::Borrowed(xml)),
        }
    }
}

/// A GPU found during the walk, before its locality is resolved.
struct FoundGpu<'a, 'input> {
    bus_id: PciAddr,
    class: u16,
    vendor: u16,
    device: u16,
    locality: Option<roxmltree::Node<'a, 'input>>,
    os_names: Vec<String>,
}

/// Reads hwloc's XML export (versions 1.x, 2.x and 3.x) into a [`Topology`].
///
/// # Errors
/// Text over [`MAX_XML_BYTES`], XML that does not parse (or defines entities),
/// a document that is not an hwloc `<topology>` with a root `<object>`, or a
/// CPU set that is not an hwloc bitmap.
pub fn from_hwloc_xml(xml: &str) -> Result<Topology, TopologyError> {
    if xml.len() > MAX_XML_BYTES {
        return Err(err(format!("{} bytes is over the {MAX_XML_BYTES}-byte limit", xml.len())));
    }
    let xml = blank_external_doctype(xml)?;
    let options =
        roxmltree::ParsingOptions { allow_dtd: false, nodes_limit: MAX_XML_NODES, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(&xml, options).map_err(|e| err(format!("XML: {e}")))?;
    let top = doc.root_element();
    if top.tag_name().name() != "topology" {
        return Err(err(format!("the root element is <{}>, not <topology>", top.tag_name().name())));
    }
    let root = top
        .children()
        .find(|n| n.is_element() && n.tag_name().name() == "object")
        .ok_or_else(|| err("<topology> has no <object>"))?;

    let mut allowed = match bitmap_attr(root, "cpuset")? {
        Some(set) => Some(set),
        None => bitmap_attr(root, "complete_cpuset")?,
    };
    for name in ["allowed_cpuset", "online_cpuset"] {
        if let (Some(base), Some(limit)) = (allowed.as_ref(), bitmap_attr(root, name)?) {
            allowed = Some(base.intersection(&limit));
        }
    }

    let mut numa: Vec<NumaNode> = Vec::new();
    // Each core's PUs, and the core's own cpuset for a core without PU children.
    let mut cores: Vec<(Vec<u32>, Option<CpuSet>)> = Vec::new();
    let mut loose_pus: Vec<u32> = Vec::new();
    let mut found: Vec<FoundGpu<'_, '_>> = Vec::new();

    // Iterative depth-first walk: (object, nearest non-I/O ancestor with a cpuset, enclosing core).
    let mut stack: Vec<(roxmltree::Node<'_, '_>, Option<roxmltree::Node<'_, '_>>, Option<usize>)> =
        vec![(root, None, None)];
    while let Some((node, locality, core)) = stack.pop() {
        let kind = node.attribute("type").unwrap_or("");
        let mut child_locality = locality;
        let mut child_core = core;
        match kind {
            "NUMANode" => {
                if let Some(os_index) = u32_attr(node, "os_index") {
                    let cpus = bitmap_attr(node, "cpuset")?.unwrap_or_default();
                    numa.push(NumaNode { os_index, cpus });
                }
            }
            "Core" => {
                cores.push((Vec::new(), bitmap_attr(node, "cpuset")?));
                child_core = Some(cores.len() - 1);
            }
            "PU" => {
                let cpus: Vec<u32> = match u32_attr(node, "os_index").filter(|c| *c <= MAX_CPU) {
                    Some(cpu) => vec![cpu],
                    // No os_index: a PU is one CPU, the first of its cpuset.
                    None => bitmap_attr(node, "cpuset")?.unwrap_or_default().iter().take(1).collect(),
                };
                match core.and_then(|i| cores.get_mut(i)) {
                    Some((pus, _)) => pus.extend(cpus),
                    None => loose_pus.extend(cpus),
                }
            }
            "PCIDev" => {
                let ids = node.attribute("pci_type").and_then(parse_pci_type);
                let bus_id = node.attribute("pci_busid").and_then(|id| PciAddr::parse_with_function(id).ok());
                if let (Some((class, vendor, device)), Some(bus_id)) = (ids, bus_id) {
                    if class >> 8 == 0x03 {
                        let os_names = node
                            .children()
                            .filter(|c| c.is_element() && c.attribute("type") == Some("OSDev"))
                            .filter_map(|c| c.attribute("name").map(str::to_owned))
                            .collect();
                        found.push(FoundGpu { bus_id, class, vendor, device, locality, os_names });
                    }
                }
            }
            _ => {}
        }
        if !is_io_type(kind) && node.attribute("cpuset").is_some() {
            child_locality = Some(node);
        }
        let children: Vec<_> =
            node.children().filter(|c| c.is_element() && c.tag_name().name() == "object").collect();
        stack.extend(children.into_iter().rev().map(|c| (c, child_locality, child_core)));
    }

    numa.sort_by_key(|n| n.os_index);
    numa.dedup_by_key(|n| n.os_index);

    // Cores: PU children, else the core's cpuset; a PU never in two cores.
    let mut seen = CpuSet::new();
    let mut keyed: Vec<(u32, CpuSet)> = Vec::with_capacity(cores.len() + loose_pus.len());
    let lone = loose_pus.into_iter().map(|c| vec![c]);
    for pus in cores
        .into_iter()
        .map(|(pus, own)| match own {
            // A core without PU children: its cpuset, unless absurdly large (hostile input).
            Some(own) if pus.is_empty() && own.len() <= MAX_PUS_PER_CORE => own.iter().collect(),
            _ => pus,
        })
        .chain(lone)
    {
        let mut fresh = CpuSet::new();
        let mut first = u32::MAX;
        for c in pus {
            if !seen.contains(c) {
                seen.insert(c);
                fresh.insert(c);
                first = first.min(c);
            }
        }
        if first != u32::MAX {
            keyed.push((first, fresh));
        }
    }
    keyed.sort_by_key(|(first, _)| *first);
    let core_sets: Vec<CpuSet> = keyed.into_iter().map(|(_, c)| c).collect();

    let allowed_cpus = allowed.unwrap_or(seen);
    let partial = Topology { numa_nodes: numa, cores: core_sets, gpus: Vec::new(), allowed_cpus };

    // Resolve each GPU's locality once per ancestor object.
    let mut cache: HashMap<roxmltree::NodeId, (CpuSet, Vec<u32>)> = HashMap::new();
    let mut gpus = Vec::with_capacity(found.len());
    for g in found {
        let (cpus, numa_nodes) = match g.locality {
            None => (CpuSet::new(), Vec::new()),
            Some(anc) => match cache.get(&anc.id()) {
                Some(hit) => hit.clone(),
                None => {
                    let cpus = bitmap_attr(anc, "cpuset")?.unwrap_or_default();
                    let mut nodes = partial.numa_of_cpus(&cpus);
                    if cpus.is_empty() {
                        let nodeset = bitmap_attr(anc, "nodeset")?.unwrap_or_default();
                        nodes = partial
                            .numa_nodes
                            .iter()
                            .map(|n| n.os_index)
                            .filter(|i| nodeset.contains(*i))
                            .collect();
                    }
                    cache.insert(anc.id(), (cpus.clone(), nodes.clone()));
                    (cpus, nodes)
                }
            },
        };
        gpus.push(PciGpu {
            bus_id: g.bus_id,
            vendor: g.vendor,
            device: g.device,
            class: g.class,
            numa_nodes,
            cpus,
            os_names: g.os_names,
        });
    }
    gpus.sort_by_key(|g| (g.bus_id, g.bus_id.function()));
    gpus.dedup_by(|a, b| a.bus_id.same_function(b.bus_id));
    Ok(Topology { gpus, ..partial })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse(list).unwrap()
    }

    #[test]
    fn bitmaps_parse_most_significant_word_first() {
        for (text, list) in [
            ("0x0", ""),
            ("", ""),
            ("0x00000001", "0"),
            ("0xffffffff", "0-31"),
            ("0x000000ff,0xffffffff", "0-39"),
            ("0x1,0x0", "32"),
            ("0x3fff0000,,,0x00003fff", "0-13,112-125"),
            ("0x00000303,0x03030000,,0x03030303", "0-1,8-9,16-17,24-25,80-81,88-89,96-97,104-105"),
            ("0x10000000,,,,,,,0x0", "252"),
            ("ff", "0-7"),
            ("0X0000000F", "0-3"),
            (" 0x1 , 0x2 ", "1,32"),
        ] {
            assert_eq!(parse_hwloc_bitmap(text).unwrap().to_string(), list, "{text:?}");
        }
    }

    #[test]
    fn bitmaps_reject_garbage() {
        for text in ["0xg", "0x123456789", "zz", "0x", "0xf...f", "0xf...f,0x0", "0x1,,0x", "1-3"] {
            assert!(parse_hwloc_bitmap(text).is_err(), "{text:?} accepted");
        }
        // A bit above MAX_CPU, and a hostile number of words, are refused without allocating them.
        let too_high = format!("0x1{}", ",".repeat(MAX_CPU as usize / 32 + 1));
        assert!(parse_hwloc_bitmap(&too_high).is_err());
        let many = ",".repeat(1 << 20);
        assert!(parse_hwloc_bitmap(&many).is_err());
        // The highest allowed CPU is accepted.
        let top = format!("0x1{}", ",".repeat(MAX_CPU as usize / 32));
        assert_eq!(parse_hwloc_bitmap(&top).unwrap().iter().collect::<Vec<_>>(), vec![MAX_CPU]);
    }

    #[test]
    fn bus_ids_normalize() {
        for (input, want) in [
            ("00000000:1B:00.0", Some("0000:1b:00.0")),
            ("0000:1b:00.0", Some("0000:1b:00.0")),
            ("1b:00.0", Some("0000:1b:00.0")),
            ("  0035:03:00.0\n", Some("0035:03:00.0")),
            ("00000035:04:00.0", Some("0035:04:00.0")),
            ("10000:01:00.1", Some("10000:01:00.1")),
            ("0000:1b:1f.7", Some("0000:1b:1f.7")),
            ("0000:1b:20.0", None),
            ("0000:1b:00.8", None),
            ("0000:1b:00", None),
            ("1b.0", None),
            ("0000:1b:00.0.0", None),
            ("000000000:1b:00.0", None),
            ("0000:1g:00.0", None),
            ("0000:+1:00.0", None),
            ("", None),
            ("a:b:c:d.0", None),
        ] {
            let got = PciAddr::parse_with_function(input).ok().map(PciAddr::hwloc);
            assert_eq!(got.as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn pci_type_field() {
        assert_eq!(parse_pci_type("0302 [10de:20b0] [10de:134f] a1"), Some((0x0302, 0x10de, 0x20b0)));
        assert_eq!(parse_pci_type("0302 [10de:1db8] [10de:131d] a1 00"), Some((0x0302, 0x10de, 0x1db8)));
        assert_eq!(parse_pci_type("0380 [1002:7408]"), Some((0x0380, 0x1002, 0x7408)));
        for bad in ["", "0302", "0302 10de:20b0", "03 [10de:20b0]", "0302 [10de20b0]", "0302 [10dex:1]"] {
            assert_eq!(parse_pci_type(bad), None, "{bad:?}");
        }
    }

    const V2: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x00000007" nodeset="0x00000003">
    <object type="Package" os_index="0" cpuset="0x00000003" nodeset="0x00000001">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" nodeset="0x00000001"/>
      <object type="Core" os_index="0" cpuset="0x00000003">
        <object type="PU" os_index="0" cpuset="0x00000001"/>
        <object type="PU" os_index="1" cpuset="0x00000002"/>
      </object>
      <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[00-01]">
        <object type="PCIDev" pci_busid="0000:01:00.0" pci_type="0302 [10de:2330] [10de:16c0] a1">
          <object type="OSDev" name="cuda0" osdev_type="5"/>
          <object type="OSDev" name="nvml0" osdev_type="1"/>
        </object>
        <object type="PCIDev" pci_busid="0000:00:02.0" pci_type="0200 [8086:1572] [8086:0000] 01"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" nodeset="0x00000002">
      <object type="NUMANode" os_index="8" cpuset="0x0000000c" nodeset="0x00000002"/>
      <object type="Core" os_index="2" cpuset="0x00000004"><object type="PU" os_index="2" cpuset="0x00000004"/></object>
      <object type="Core" os_index="3" cpuset="0x00000008"><object type="PU" os_index="3" cpuset="0x00000008"/></object>
      <object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0004:[00-01]">
        <object type="PCIDev" pci_busid="0004:01:00.0" pci_type="0380 [1002:7408] [1002:0c34] 01">
          <object type="OSDev" name="rsmi0" osdev_type="1"/>
        </object>
      </object>
    </object>
    <object type="NUMANode" os_index="255" cpuset="0x0" nodeset="0x80000000,,,,,,,0x0"/>
  </object>
</topology>
"#;

    #[test]
    fn reads_a_small_v2_topology() {
        let t = from_hwloc_xml(V2).unwrap();
        assert_eq!(
            t.numa_nodes,
            vec![
                NumaNode { os_index: 0, cpus: set("0-1") },
                NumaNode { os_index: 8, cpus: set("2-3") },
                NumaNode { os_index: 255, cpus: CpuSet::new() },
            ]
        );
        assert_eq!(t.cores, vec![set("0-1"), set("2"), set("3")]);
        assert_eq!(t.allowed_cpus, set("0-2"));
        assert_eq!(t.gpus.len(), 2, "the NIC is not a GPU");
        let nv = t.gpu_by_bus_id("00000000:01:00.0").unwrap();
        assert_eq!((nv.vendor, nv.device, nv.class), (0x10de, 0x2330, 0x0302));
        assert_eq!(nv.cpus, set("0-1"));
        assert_eq!(nv.numa_nodes, vec![0]);
        assert_eq!(nv.os_names, vec!["cuda0", "nvml0"]);
        assert_eq!(t.gpu_by_os_name("nvml0").map(|g| g.bus_id.hwloc()), Some("0000:01:00.0".to_owned()));
        let amd = t.gpu_by_bus_id("0004:01:00.0").unwrap();
        assert_eq!(
            (amd.vendor, amd.cpus.to_string(), amd.numa_nodes.clone()),
            (0x1002, "2-3".into(), vec![8])
        );
        assert_eq!(t.nvidia_gpus().map(|g| g.bus_id.hwloc()).collect::<Vec<_>>(), vec!["0000:01:00.0"]);
        assert_eq!(t.numa_of_cpus(&set("1-2")), vec![0, 8]);
        assert_eq!(t.numa_of_cpus(&set("100")), Vec::<u32>::new());
        assert_eq!(t.cpus_of_numa(&[8, 255, 7]), set("2-3"));
    }

    #[test]
    fn reads_hwloc1_layout_with_numa_parents_and_no_cores() {
        let xml = r#"<?xml version="1.0"?>
<!DOCTYPE topology SYSTEM "hwloc.dtd">
<topology>
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" online_cpuset="0x0000000d" allowed_cpuset="0x0000000f">
    <object type="NUMANode" os_index="1" cpuset="0x00000003" nodeset="0x00000002">
      <object type="Socket" os_index="0" cpuset="0x00000003">
        <object type="PU" os_index="0" cpuset="0x00000001"/>
        <object type="PU" os_index="1" cpuset="0x00000002"/>
      </object>
      <object type="Bridge" os_index="0" bridge_type="0-1" depth="0" bridge_pci="0000:[00-02]">
        <object type="Bridge" os_index="16" bridge_type="1-1" depth="1" bridge_pci="0000:[01-02]" pci_busid="0000:00:01.0" pci_type="0604 [8086:0000] [0000:0000] 00">
          <object type="PCIDev" os_index="4096" pci_busid="0000:02:00.0" pci_type="0300 [10de:1b81] [1043:8598] a1">
            <object type="OSDev" name="card0" osdev_type="1"/>
          </object>
        </object>
      </object>
    </object>
    <object type="NUMANode" os_index="0" cpuset="0x0000000c" nodeset="0x00000001">
      <object type="PU" os_index="2" cpuset="0x00000004"/>
      <object type="PU" os_index="3" cpuset="0x00000008"/>
    </object>
  </object>
</topology>"#;
        let t = from_hwloc_xml(xml).unwrap();
        assert_eq!(t.numa_nodes.iter().map(|n| n.os_index).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(t.cores, vec![set("0"), set("1"), set("2"), set("3")], "PUs without cores are cores");
        assert_eq!(t.allowed_cpus, set("0,2-3"), "offline CPU 1 is not allowed");
        let g = t.gpu_by_bus_id("02:00.0").unwrap();
        assert_eq!((g.cpus.to_string(), g.numa_nodes.clone()), ("0-1".into(), vec![1]));
        assert_eq!(t.nvidia_gpus().count(), 1, "an NVIDIA VGA-class GPU counts");
    }

    #[test]
    fn locality_without_cpus_falls_back_to_the_nodeset() {
        let xml = r#"<topology version="2.0">
  <object type="Machine" cpuset="0x3" nodeset="0x3">
    <object type="Group" cpuset="0x0" nodeset="0x2">
      <object type="NUMANode" os_index="0" cpuset="0x1"/>
      <object type="NUMANode" os_index="1" cpuset="0x0"/>
      <object type="PCIDev" pci_busid="0009:01:00.0" pci_type="0302 [10de:2342] [10de:16eb] a1"/>
    </object>
  </object>
</topology>"#;
        let t = from_hwloc_xml(xml).unwrap();
        let g = t.gpu_by_bus_id("0009:01:00.0").unwrap();
        assert!(g.cpus.is_empty());
        assert_eq!(g.numa_nodes, vec![1]);
        assert_eq!(t.allowed_cpus, set("0-1"));
        assert!(t.cores.is_empty());
    }

    #[test]
    fn rejects_what_is_not_a_topology() {
        for (xml, why) in [
            ("", "XML"),
            ("<topology", "XML"),
            ("<lstopo/>", "not <topology>"),
            ("<topology version=\"2.0\"></topology>", "no <object>"),
            ("<topology><object type=\"Machine\" cpuset=\"0xzz\"/></topology>", "cpuset"),
            (
                "<topology><object type=\"Machine\" cpuset=\"0x1\"><object type=\"NUMANode\" os_index=\"0\" cpuset=\"1-3\"/></object></topology>",
                "NUMANode",
            ),
            (
                "<!DOCTYPE t [<!ENTITY a \"aaaa\"><!ENTITY b \"&a;&a;&a;\">]><topology><object type=\"Machine\" cpuset=\"0x1\"/></topology>",
                "internal subset",
            ),
            (
                "<?xml version=\"1.0\"?><!-- c --><topology><!DOCTYPE topology SYSTEM \"x\"><object type=\"Machine\" cpuset=\"0x1\"/></topology>",
                "XML",
            ),
            ("<!DOCTYPE topology SYSTEM \"hwloc2.dtd\"", "unterminated"),
            (
                "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\"><!DOCTYPE topology SYSTEM \"hwloc2.dtd\"><topology/>",
                "XML",
            ),
        ] {
            let e = from_hwloc_xml(xml).unwrap_err();
            assert!(e.to_string().contains(why), "{xml:?}: {e}");
        }
        let huge = " ".repeat(MAX_XML_BYTES + 1);
        assert!(from_hwloc_xml(&huge).unwrap_err().reason.contains("limit"));
    }

    #[test]
    fn cores_without_pus_and_pus_without_os_index() {
        let xml = r#"<topology><object type="Machine" cpuset="0xff">
            <object type="Core" cpuset="0x3"/>
            <object type="Core" cpuset="0xc"><object type="PU" cpuset="0x4"/><object type="PU" cpuset="0x8"/></object>
            <object type="Core" cpuset="0x10"><object type="PU" os_index="4"/><object type="PU" os_index="4"/></object>
            <object type="Core" cpuset="0x18"><object type="PU" os_index="3"/></object>
            <object type="Core" cpuset="0xffffffff,0xffffffff,0xffffffff"/>
        </object></topology>"#;
        let t = from_hwloc_xml(xml).unwrap();
        assert_eq!(t.cores, vec![set("0-1"), set("2-3"), set("4")], "no PU counted twice, no absurd core");
    }

    #[test]
    fn deep_nesting_and_odd_objects_do_not_panic() {
        let depth = 20_000;
        let mut xml = String::from("<topology><object type=\"Machine\" cpuset=\"0x1\">");
        for _ in 0..depth {
            xml.push_str("<object type=\"Group\" cpuset=\"0x1\">");
        }
        xml.push_str("<object type=\"PU\" os_index=\"0\"/>");
        xml.push_str(&"</object>".repeat(depth));
        xml.push_str("</object></topology>");
        // roxmltree may refuse the depth; either way there is no stack overflow.
        if let Ok(t) = from_hwloc_xml(&xml) {
            assert_eq!(t.cores, vec![set("0")]);
        }
        let odd = r#"<topology><object type="Machine" cpuset="0x1">
            <object type="PCIDev" pci_busid="zz" pci_type="0302 [10de:2330]"/>
            <object type="PCIDev" pci_busid="0000:01:00.0" pci_type="junk"/>
            <object type="PCIDev" pci_busid="0000:01:00.0"/>
            <object type="NUMANode"/>
            <object type="PU" os_index="99999999999"/>
            <object/>
        </object></topology>"#;
        let t = from_hwloc_xml(odd).unwrap();
        assert!(t.gpus.is_empty() && t.numa_nodes.is_empty() && t.cores.is_empty());
    }
}

#[cfg(test)]
mod synthetic_tests {
    use super::*;
    use task_plan::topology::{format_hwloc_bitmap, synthetic_xml};

    #[test]
    fn bitmaps_round_trip() {
        for text in ["0", "0-3", "31-33", "0,64,100"] {
            let set = CpuSet::parse(text).unwrap();
            assert_eq!(parse_hwloc_bitmap(&format_hwloc_bitmap(&set)).unwrap(), set, "{text}");
        }
    }

    #[test]
    fn synthetic_topologies_parse_as_described() {
        let xml = synthetic_xml(&[
            (CpuSet::parse("0-7").unwrap(), vec!["0000:1b:00.0", "0000:43:00.0"]),
            (CpuSet::parse("8-15").unwrap(), vec!["0000:9d:00.0"]),
        ]);
        let t = from_hwloc_xml(&xml).unwrap();
        assert_eq!(t.numa_nodes.len(), 2);
        assert_eq!(t.cores.len(), 16);
        assert_eq!(t.nvidia_gpus().count(), 3);
        let g = t.gpu_by_bus_id("0000:9d:00.0").unwrap();
        assert_eq!((g.numa_nodes.clone(), g.cpus.to_string()), (vec![1], "8-15".to_owned()));
        assert_eq!(t.gpu_by_bus_id("0000:43:00.0").unwrap().numa_nodes, vec![0]);
    }
}
