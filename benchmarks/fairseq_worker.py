"""fairseq's side of benchmarks/speed.py, run with the python of fairseq's own environment.

    python fairseq_worker.py train FAIRSEQ-TRAIN ARGS...
    python fairseq_worker.py translate JOB.json

train: fairseq-train itself (its own command-line entry point), after the process settings every
measured process gets (denormal floats flushed to zero; the malloc settings come through the
environment speed.py gives every worker). translate: the model is loaded once, outside the timing,
and the whole list of sources is translated ``warmup`` times untimed (default 0), then ``repeat``
times timed, with fairseq's own SequenceGenerator in batches built as fairseq-generate builds them;
the fastest is kept (speed_worker.time_best, beside this file). Prints one JSON line, as
speed_worker.py does. Imports nothing of our package: this environment has fairseq, not ours.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from speed_worker import time_best, usage_unless  # the script's own folder: its module-level imports are the stdlib's


def translate(job: dict) -> dict:
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([job["checkpoint"]],
                                                                     arg_overrides={"data": job["data_bin"]})
    for model in models:
        model.eval()
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    tokens = [src_dict.encode_line(" ".join(line), add_if_not_exist=False, append_eos=True).long()
              for line in job["sources"]]
    dataset = task.build_dataset_for_inference(tokens, [len(t) for t in tokens])
    generator = SequenceGenerator(models, tgt_dict, beam_size=job["beam"], len_penalty=job["alpha"],
                                  max_len_a=1, max_len_b=job["max_len_offset"])

    def run() -> list[list[str]]:
        outputs: dict[int, list[str]] = {}
        batches = task.get_batch_iterator(dataset, max_sentences=job["batch"], max_tokens=None,
                                          num_workers=0).next_epoch_itr(shuffle=False)
        with torch.inference_mode():
            for sample in batches:
                hyps = task.inference_step(generator, models, sample)
                for i, sent_id in enumerate(sample["id"].tolist()):
                    best = hyps[i][0]["tokens"].tolist()
                    outputs[sent_id] = [tgt_dict[t] for t in best if t != tgt_dict.eos()]
        return [outputs[i] for i in sorted(outputs)]

    best, outputs = time_best(run, job["repeat"], job.get("warmup", 0))
    return {"seconds": best, "sentences": len(outputs), "outputs": outputs}


def main() -> None:
    usage_unless(__doc__, len(sys.argv) > 1 and sys.argv[1] == "train"
                 or len(sys.argv) == 3 and sys.argv[1] == "translate")
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    if sys.argv[1] == "train":
        from fairseq_cli.train import cli_main

        sys.argv = ["fairseq-train", *sys.argv[2:]]
        cli_main()
    else:
        print(json.dumps(translate(json.loads(Path(sys.argv[2]).read_text(encoding="utf-8")))))


if __name__ == "__main__":
    main()
