"""TDT greedy decoding on the device: the prediction network (embedding, LSTM layers, projection)
and the joint network run as launches over resident weights and state; the host picks the
argmax token and duration and moves the frame pointer.

The loop is transformers' ParakeetForTDT.generate (greedy): start from the decoder start token
(the blank); at each step the joint network scores relu(enc[t] + dec) for tokens and durations;
the token is emitted (blanks too, as transformers' sequences hold them; the text drops them), the
pointer advances by the predicted duration, a blank of duration 0 advances by 1; the prediction
network runs again only after a non-blank token (a blank keeps its output and state: transformers'
"all-blank fast path"). At most max_symbols_per_step x frames steps. Every step runs the same
Program [predict, joint] (one hardware context); after a blank the predict launch's `run`
scalar is 0 and it returns at once.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.blocks.conformer import TransducerJointDesign, TransducerPredictDesign
from torch_xdna.models.hf import read_json
from torch_xdna.runtime import Launch, Program, TensorArg


class TdtDecoder:
    """The TDT decoding network of a ParakeetModel (spec.head == "tdt"), resident on its device."""

    def __init__(self, model, sd: dict[str, torch.Tensor] | None = None):
        """`sd`: the directory's state dict when the caller has read it (else read here)."""
        from torch_xdna.models.speech.parakeet import load_parakeet_weights
        self.model, self.dev, s = model, model.dev, model.spec
        self.spec = s
        dt = torch.float32 if model.precision == "fp32" else torch.bfloat16
        sd = sd if sd is not None else load_parakeet_weights(model.files)
        host = {"emb": sd["decoder.embedding.weight"].to(dt),
                "proj.w": sd["decoder.decoder_projector.weight"].to(dt),
                "proj.b": sd["decoder.decoder_projector.bias"].to(dt),
                "joint.w": sd["joint.head.weight"].to(dt), "joint.b": sd["joint.head.bias"].to(dt)}
        for i in range(s.decoder_layers):
            g = f"decoder.lstm.{{}}_l{i}"
            host[f"lstm{i}.w"] = torch.cat([sd[g.format("weight_ih")],
                                            sd[g.format("weight_hh")]], dim=1).to(dt).contiguous()
            host[f"lstm{i}.b"] = (sd[g.format("bias_ih")] + sd[g.format("bias_hh")]).to(dt)
        gen_path = model.files.path / "generation_config.json"
        gen = read_json(gen_path) if gen_path.is_file() else {}
        self.start = int(gen.get("decoder_start_token_id", s.blank))
        self._scalars: dict = {"frame": 0, "run": 1}
        d = s.decoder_hidden
        # owned by the model: its close() frees them
        self.w = {k: model.upload(v) for k, v in host.items()}
        self.ids = model.empty((1,), torch.int32)
        self.h = model.empty((s.decoder_layers, d), torch.float32)
        self.c = model.empty((s.decoder_layers, d), torch.float32)
        self.dec = model.empty((1, d), torch.float32)
        self.logits = model.empty((1, s.joint_out), torch.float32)

    def program(self, enc: TensorArg) -> Program:
        """The step Program over the encoder frames `enc`: predict (if `run`), then joint."""
        s, w, p = self.spec, self.w, self.model.precision
        lstm = [w[f"lstm{i}.{n}"] for i in range(s.decoder_layers) for n in "wb"]
        return Program([
            Launch(TransducerPredictDesign(s.decoder_hidden, s.decoder_layers, s.vocab, p),
                   [self.ids, w["emb"], *lstm, w["proj.w"], w["proj.b"]],
                   [self.h, self.c, self.dec], self._scalars, op="tdt.predict"),
            Launch(TransducerJointDesign(s.decoder_hidden, enc.shape[0], s.joint_out, p),
                   [enc, self.dec, w["joint.w"], w["joint.b"]], [self.logits], self._scalars,
                   op="tdt.joint")], name="parakeet.tdt_step")

    def decode(self, frames: torch.Tensor) -> list[tuple[int, int]]:
        """(token, frame) of the non-blank tokens of greedy TDT over the encoder projection
        `frames` [T, D] (fp32, host); the whole sequence with blanks is kept in `steps`."""
        s = self.spec
        n = frames.shape[0]
        enc = self.dev.upload(frames.contiguous())
        try:
            self.dev.write(self.h.buffer, torch.zeros(self.h.shape))
            self.dev.write(self.c.buffer, torch.zeros(self.c.shape))
            token, t, out, steps, at_frame = self.start, 0, [], [], 0
            prog = self.program(enc)
            for _ in range(s.max_symbols * n):
                predict = not steps or token != s.blank
                if predict:
                    self.dev.write(self.ids.buffer, torch.tensor([token], dtype=torch.int32))
                self._scalars.update(frame=min(t, n - 1), run=int(predict))
                self.dev.run_program(prog)
                logits = self.dev.download(self.logits)[0]
                token = int(logits[:s.vocab].argmax())
                dur = s.durations[int(logits[s.vocab:].argmax())]
                if token == s.blank and dur == 0:
                    dur = 1
                at_frame = at_frame + 1 if dur == 0 else 0
                if at_frame >= s.max_symbols:       # NeMo's guard (transformers' TDT has none)
                    dur, at_frame = 1, 0
                steps.append((token, dur))
                if token != s.blank:
                    out.append((token, min(t, n - 1)))
                t += dur
                if t >= n:
                    break
            self.steps = steps
            return out
        finally:
            self.dev.free(enc.buffer)
