"""The parts every family is built from: attention over heads (with grouped key/value heads), the norms, rotary
position embeddings, activations and the gated MLP. A family's model file imports them and reads like its paper;
each part declares what it computes, so the layers above ask it instead of guessing."""
