"""Score generated digits: a classifier trained on the real digits labels them."""

from __future__ import annotations

import numpy as np
import torch

from loong_diffusion.data.digits import load_digits_array


def train_classifier(valid_fraction: float = 0.2, seed: int = 0):
    """An RBF support-vector classifier on the real 8x8 digits; returns ``(classifier, held-out accuracy)``."""
    from sklearn.svm import SVC

    images, labels = load_digits_array()
    perm = np.random.default_rng(seed).permutation(len(labels))
    n_valid = int(len(perm) * valid_fraction)
    x = images.reshape(len(images), -1)
    clf = SVC(C=10.0, gamma="scale").fit(x[perm[n_valid:]], labels[perm[n_valid:]])
    accuracy = float((clf.predict(x[perm[:n_valid]]) == labels[perm[:n_valid]]).mean())
    return clf, accuracy


def score(samples: torch.Tensor, labels: torch.Tensor, classifier=None) -> dict:
    """Share of ``samples [N, 1, 8, 8]`` (in [-1, 1]) classified as the class they were conditioned on."""
    if classifier is None:
        classifier, real_accuracy = train_classifier()
    else:
        real_accuracy = float("nan")
    x = samples.detach().float().clamp(-1, 1).reshape(len(samples), -1).cpu().numpy()
    predicted = classifier.predict(x)
    target = labels.cpu().numpy()
    per_class = {int(c): float((predicted[target == c] == c).mean()) for c in np.unique(target)}
    return {"accuracy": float((predicted == target).mean()), "per_class": per_class,
            "classifier_accuracy_on_real": real_accuracy, "num_samples": len(target)}
