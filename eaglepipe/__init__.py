"""eaglepipe: prompt sets to EAGLE-3 drafters, one Snakemake stage per subpackage."""
