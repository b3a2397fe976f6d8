"""Circuit tracing: transcoders (transcoders.py), the local replacement model and attribution graphs
(attribution.py), and what is computed from a graph: influence, pruning, scores, circuit-tracer's frontend files
(graph.py). Analysis above the models, beside dictionaries/: it reads hook points and the families' declarations.

    from scratch_models.circuits import attribute, load_transcoders, prune_graph
    transcoders = load_transcoders("path/to/set")          # circuit-tracer's layout: config.yaml + its files
    transcoders = load_transcoders("google/gemma-scope-2-1b-pt/transcoder_all/width_16k_l0_small")  # Gemma Scope 2
    graph = attribute(model, transcoders, input_ids)       # circuit-tracer's node order and numbers
    pruned = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
"""

from .attribution import ReplacementModel, attribute
from .graph import Graph, compute_influence, frontend_json, graph_scores, node_influence, prune_graph, \
    write_frontend_files
from .interventions import feature_intervention, feature_intervention_generate
from .splice import spliced
from .transcoders import Transcoders, TranscoderConfig, load as load_transcoders, save as save_transcoders

__all__ = ["Graph", "ReplacementModel", "TranscoderConfig", "Transcoders", "attribute", "compute_influence",
           "feature_intervention", "feature_intervention_generate", "frontend_json", "graph_scores",
           "load_transcoders", "node_influence", "prune_graph", "save_transcoders", "spliced", "write_frontend_files"]
