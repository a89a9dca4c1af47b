//! `roar-fleet`: one simulated node's project store, or what the fleet's lineage targets are.
//!
//!     roar-fleet node --nodes 100 --jobs 2000 --seed 1 --node 7 DIR   # writes node 7 into DIR
//!     roar-fleet targets --nodes 100 --jobs 2000 --seed 1             # a path to ask lineage of
//!
//! bench/team.sh runs one `node` process per node, then `roar push` in each project.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use roar_fleet::Shape;

#[derive(Parser)]
#[command(about = "A simulated fleet for the team store's benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct ShapeArgs {
    /// Nodes in the fleet.
    #[arg(long)]
    nodes: u32,
    /// Jobs each node records (about).
    #[arg(long)]
    jobs: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl ShapeArgs {
    fn shape(&self) -> Result<Shape, String> {
        if self.nodes == 0 || self.jobs == 0 {
            return Err("--nodes and --jobs must be at least 1".into());
        }
        Ok(Shape::new(self.nodes, self.jobs, self.seed))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Write one node's job stream into the project at DIR (made if needed).
    Node {
        #[command(flatten)]
        shape: ShapeArgs,
        /// Which node (0-based).
        #[arg(long)]
        node: u32,
        dir: PathBuf,
    },
    /// Print the path whose lineage the benchmark asks: the checkpoint of the last of the widest
    /// runs (64 ranks in a fleet of 8 nodes or more), with the chain of runs it resumed.
    Targets {
        #[command(flatten)]
        shape: ShapeArgs,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("roar-fleet: {e}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Node { shape, node, dir } => {
            let shape = shape.shape()?;
            if node >= shape.nodes {
                return Err(format!(
                    "--node {node} is not below --nodes {}",
                    shape.nodes
                ));
            }
            let written = roar_fleet::write_node(&shape, node, &dir).map_err(|e| e.to_string())?;
            println!("{} {}", written.jobs, written.files);
        }
        Command::Targets { shape } => {
            let shape = shape.shape()?;
            // The last of the runs of most ranks (max_by_key keeps the last of equals).
            let widest = (0..shape.runs)
                .max_by_key(|&g| shape.world_size(g))
                .expect("a fleet has a run");
            println!("{}", shape.run_checkpoint(widest).0.display());
        }
    }
    Ok(())
}
