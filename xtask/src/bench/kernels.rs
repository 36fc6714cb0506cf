//! `cargo xtask bench kernels`: the Flex kernels' own rates, outside any model (on the host CPU).
//!
//! - `kernels::matmul` against Burn's matmul on the LM head's shape, `[m, 576] × [49152, 576]ᵀ`
//!   (SmolLM2-135M's tied embedding table, read transposed), for each `m` of `--rows`;
//! - the integer strip kernel of the GGUF-layout product, single-threaded, with each instruction
//!   set this CPU runs it with, at SmolLM2-135M's shapes (Q4_1 projections, the Q8_0 head), with
//!   the weights in cache (`[576, 1536]`) and streamed from memory (`[576, 49152]`).

use std::path::PathBuf;

use burn::tensor::{Device, Distribution, Tensor};
use burn_llm::kernels::quant::StripProduct;
use burn_llm::offload::profiler::time;
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Flags of `bench kernels`.
#[derive(clap::Args)]
pub struct Args {
    /// Input rows of the LM-head products.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128,512")]
    rows: Vec<usize>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// The LM head's embedding table: `[vocabulary, hidden]`.
const HEAD: [usize; 2] = [49152, 576];

#[derive(Serialize)]
struct MatmulRow {
    m: usize,
    /// `kernels::matmul`.
    kernels_ms: f64,
    /// Burn's `matmul`.
    burn_ms: f64,
}

#[derive(Serialize)]
struct StripRow {
    shape: String,
    isa: &'static str,
    ms: f64,
    gmac_s: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    lm_head_matmul: Vec<MatmulRow>,
    strip_kernel: Vec<StripRow>,
}

fn lm_head_matmul(rows: &[usize]) -> Vec<MatmulRow> {
    let device = Device::flex();
    let [vocab, hidden] = HEAD;
    let table = Tensor::<2>::random([vocab, hidden], Distribution::Uniform(-1.0, 1.0), &device);
    rows.iter()
        .map(|&m| {
            let x = Tensor::<2>::random([m, hidden], Distribution::Uniform(-1.0, 1.0), &device);
            let kernels_s = time(5, || {
                let _ = burn_llm::kernels::matmul(x.clone(), table.clone().transpose()).into_data();
            });
            let burn_s = time(5, || {
                let _ = x.clone().matmul(table.clone().transpose()).into_data();
            });
            let row = MatmulRow { m, kernels_ms: kernels_s * 1e3, burn_ms: burn_s * 1e3 };
            eprintln!("LM head m = {m}: kernels::matmul {:.2} ms, Burn {:.2} ms", row.kernels_ms, row.burn_ms);
            row
        })
        .collect()
}

fn strip_kernel() -> Result<Vec<StripRow>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for (k, n, bits, m) in [(576, 1536, 4, 32), (576, 1536, 4, 8), (576, 8192, 8, 32), (576, 49152, 8, 32)] {
        let product = StripProduct::random(m, k, n, bits, 9)?;
        for isa in product.instruction_sets() {
            // Enough repetitions for about 2·10⁹ multiply-adds per sample.
            let reps = (2e9 / (m * k * n) as f64).ceil() as usize;
            let seconds = time(3, || {
                for _ in 0..reps {
                    std::hint::black_box(product.run(isa));
                }
            }) / reps as f64;
            let row = StripRow {
                shape: format!("[{m}, {k}] × [{k}, {n}] Q{bits}"),
                isa,
                ms: seconds * 1e3,
                gmac_s: (m * k * n) as f64 / seconds / 1e9,
            };
            eprintln!("{} {isa}: {:.3} ms, {:.1} GMAC/s", row.shape, row.ms, row.gmac_s);
            out.push(row);
        }
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let lm_head_matmul = lm_head_matmul(&args.rows);
    let strip_kernel = strip_kernel()?;
    let rows = args.rows.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let header = Header::new("kernels", format!("cargo xtask bench kernels --rows {rows}"), Some("flex"), "none");
    let mut md = header.markdown("Flex kernels");
    md.push_str(&format!(
        "\n## `kernels::matmul` vs Burn on the LM head ([m, {}] × [{}, {}]ᵀ)\n\n",
        HEAD[1], HEAD[0], HEAD[1]
    ));
    md.push_str(&table(
        &[("m", Right), ("`kernels::matmul` ms", Right), ("Burn ms", Right)],
        lm_head_matmul
            .iter()
            .map(|r| vec![r.m.to_string(), format!("{:.2}", r.kernels_ms), format!("{:.2}", r.burn_ms)]),
    ));
    md.push_str("\n## Integer strip kernel, one thread\n\n");
    if strip_kernel.is_empty() {
        md.push_str("Not run: this CPU has neither AVX2 nor AVX-512 VNNI.\n");
    } else {
        md.push_str(&table(
            &[("product", Left), ("instruction set", Left), ("ms", Right), ("GMAC/s", Right)],
            strip_kernel
                .iter()
                .map(|r| vec![r.shape.clone(), r.isa.to_string(), format!("{:.3}", r.ms), format!("{:.1}", r.gmac_s)]),
        ));
    }
    report::write(&args.out, "kernels", &Report { header, lm_head_matmul, strip_kernel }, &md)?;
    Ok(())
}
