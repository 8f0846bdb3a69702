"""A Lightning training script as a user writes it (imports nothing of stallbench):
``Trainer.fit`` with a LightningDataModule (train and val loaders), on the CPU, with
Lightning's own ``profiler="simple"``.

    user_lightning.py ITEM_MS STEP_MS [BATCHES_PER_EPOCH] [EPOCHS]

Items cost ITEM_MS (a sleep: the data path), the training step STEP_MS (a sleep). Lightning's
``_DataFetcher`` asks for exactly ``len(loader)`` batches and prefetches one ahead on the
loop's own thread. The last line printed is ``truth: {...}``: Lightning's own
``train_dataloader_next`` total (seconds the fit loop was blocked on its training loader,
from its simple profiler), its batches and samples.
"""

import json
import sys
import time

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 4


class Items(Dataset):
    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return torch.full((3,), float(i)), torch.tensor(float(i % 2))


class Data(pl.LightningDataModule):
    def __init__(self, per_epoch, item_s):
        super().__init__()
        self.per_epoch, self.item_s = per_epoch, item_s

    def train_dataloader(self):
        return DataLoader(Items(self.per_epoch * BATCH, self.item_s), batch_size=BATCH)

    def val_dataloader(self):
        return DataLoader(Items(2 * BATCH, 0.0), batch_size=BATCH)


class Model(pl.LightningModule):
    def __init__(self, step_s):
        super().__init__()
        self.step_s = step_s
        self.layer = torch.nn.Linear(3, 1)
        self.seen = [0, 0]

    def training_step(self, batch, i):
        x, y = batch
        time.sleep(self.step_s)
        self.seen[0] += 1
        self.seen[1] += x.shape[0]
        return torch.nn.functional.mse_loss(self.layer(x).squeeze(1), y)

    def validation_step(self, batch, i):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    item_ms, step_ms = float(sys.argv[1]), float(sys.argv[2])
    per_epoch = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    model = Model(step_ms / 1e3)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=epochs, profiler="simple", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=Data(per_epoch, item_ms / 1e3))
    durations = trainer.profiler.recorded_durations
    nxt = sum(v for k, vs in durations.items() if k.startswith("[_TrainingEpochLoop]")
              and k.endswith("train_dataloader_next") for v in vs)
    print("truth: " + json.dumps({"next_s": nxt, "batches": model.seen[0],
                                  "samples": model.seen[1]}))


if __name__ == "__main__":
    main()
