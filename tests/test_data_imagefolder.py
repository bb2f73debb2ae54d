"""The image-folder data source: real PNG/JPEG files, ImageNet transforms as torch ops, seeded,
clear errors."""

import math

import numpy as np
import pytest
import torch

from bnlab import data
from bnlab.data import image_transforms as T
from bnlab.data.image_writer import MARKER, ensure_generated, write_image_folder
from bnlab.data.imagefolder import decode


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "tiny"
    write_image_folder(root, classes=3, train_per_class=5, val_per_class=2, size=20,
                       fmt="jpeg", seed=1)
    return root


def load(folder, **options):
    options = {"image_size": 12, "resize_size": 16, **options}
    return data.load("imagefolder", data_dir=folder.parent, folder=folder.name, **options)


def test_writer_writes_real_image_files_deterministically(tmp_path):
    from PIL import Image

    for fmt, pil_name in (("png", "PNG"), ("jpeg", "JPEG")):
        a = write_image_folder(tmp_path / f"a-{fmt}", classes=2, train_per_class=2,
                               val_per_class=1, fmt=fmt)
        b = write_image_folder(tmp_path / f"b-{fmt}", classes=2, train_per_class=2,
                               val_per_class=1, fmt=fmt)
        assert len(a["train"]) == 4 and len(a["val"]) == 2
        for pa, pb in zip(a["train"], b["train"]):
            with Image.open(pa) as img:
                assert img.format == pil_name and img.mode == "RGB"
            assert pa.read_bytes() == pb.read_bytes()
    with pytest.raises(ValueError, match="png, jpeg"):
        write_image_folder(tmp_path / "c", fmt="gif")


def test_registered_and_shapes(folder):
    assert "imagefolder" in data.SOURCES
    ds = load(folder)
    assert ds.input_shape == (3, 12, 12) and ds.num_outputs == 3 and ds.task == "classification"
    assert ds.n_train == 15 and ds.n_test == 6
    assert ds.meta["classes"] == ["class_00", "class_01", "class_02"]
    assert ds.y_train.tolist() == [0] * 5 + [1] * 5 + [2] * 5 \
        and ds.y_test.tolist() == [0, 0, 1, 1, 2, 2]
    xb = ds.x_train.index_select(0, torch.tensor([0, 7, 14]))
    assert xb.shape == (3, 3, 12, 12) and xb.dtype == torch.float32
    assert ds.x_test[:4].shape == (4, 3, 12, 12) and ds.x_test[1].shape == (3, 12, 12)


def test_eval_transform_is_resize_then_center_crop(folder):
    """Val images: shorter side to resize_size, centre crop, ImageNet normalization — checked by
    hand."""
    from PIL import Image

    ds = load(folder)
    path = sorted((folder / "val" / "class_01").iterdir())[0]
    with Image.open(path) as img:
        raw = torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1).float()
    _, h, w = raw.shape
    short = 16
    size = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
    resized = torch.nn.functional.interpolate(raw[None], size=size, mode="bilinear",
                                              antialias=True)[0]
    top, left = int(round((size[0] - 12) / 2)), int(round((size[1] - 12) / 2))
    crop = resized[:, top:top + 12, left:left + 12].round().clamp(0, 255)
    mean = torch.tensor(T.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(T.IMAGENET_STD).view(3, 1, 1)
    torch.testing.assert_close(ds.x_test[2], (crop / 255 - mean) / std)


def test_eval_transform_matches_torchvision():
    """resize_shorter + center_crop against torchvision's Resize + CenterCrop on a non-square
    image."""
    from tests.vision_shim import import_or_skip

    tv = import_or_skip("torchvision")
    from torchvision.transforms.v2 import functional as TF

    image = torch.randint(0, 256, (3, 37, 53), generator=torch.Generator().manual_seed(0),
                          dtype=torch.uint8)
    ours = T.center_crop(T.resize_shorter(image, 24), 20)
    ref = TF.center_crop(TF.resize(image.float(), [24], antialias=True), [20, 20])
    assert tv is not None and ours.shape == ref.shape == (3, 20, 20)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_crop_boxes_obey_scale_and_ratio():
    g = torch.Generator().manual_seed(3)
    boxes, flip = T.crop_boxes(4000, 40, 60, g)
    top, left, h, w = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 40).all() \
        and (left + w <= 60).all()
    share, aspect = (h * w).double() / 2400, w.double() / h.double()
    # rounding of h and w moves the share and ratio a little past the bounds on small boxes
    assert share.min() > 0.06 and share.max() <= 1.0
    assert aspect.min() > 0.7 and aspect.max() < 1.45
    assert 0.45 < flip.double().mean() < 0.55
    # a 1 x 100 image admits no box of area >= 8 with ratio in [3/4, 4/3] (its height would be 2):
    # every image gets the centred fallback, height 1 and width round(4/3) = 1
    fallback, _ = T.crop_boxes(5, 1, 100, g)
    assert fallback.tolist() == [[0, 49, 1, 1]] * 5


def test_random_resized_crop_of_the_whole_image_is_resize_or_its_flip():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(16, 3, 10, 10, generator=g) * 255
    out = T.random_resized_crop_flip(images, 6, g, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    whole = torch.nn.functional.interpolate(images, size=(6, 6), mode="bilinear", antialias=True)
    same = (out - whole).abs().amax(dim=(1, 2, 3)) < 1e-4
    flipped = (out - whole.flip(-1)).abs().amax(dim=(1, 2, 3)) < 1e-4
    assert (same | flipped).all() and same.any() and flipped.any()


def test_augmentation_seeded_and_workers_and_cache_agree(folder):
    index = torch.tensor([0, 3, 9, 12])
    a, b = load(folder, seed=5), load(folder, seed=5, cache="none", workers=2)
    c = load(folder, seed=6)
    first = a.x_train.index_select(0, index)
    torch.testing.assert_close(first, b.x_train.index_select(0, index))
    assert not torch.allclose(first, c.x_train.index_select(0, index))
    # fresh crops on each request
    assert not torch.allclose(first, a.x_train.index_select(0, index))
    plain = load(folder, augment=False)
    # no augmentation: no randomness
    torch.testing.assert_close(plain.x_train[:3], plain.x_train[:3])
    torch.testing.assert_close(load(folder, cache="none").x_test[:], plain.x_test[:])


def test_trains_through_the_engine(folder, tmp_path):
    from bnlab.train import run

    record = run(dict(model="resnet20", model_options={"width": 0.25}, data="imagefolder",
                      data_dir=str(folder.parent), data_options={
                          "folder": folder.name, "image_size": 12, "resize_size": 16},
                      steps=3, batch_size=5, lr=0.05,
                      runs_dir=str(tmp_path / "runs")), progress=False)
    assert record.status == "finished" and math.isfinite(record.metrics["train_loss"])
    assert 0.0 <= record.metrics["test_accuracy"] <= 1.0


def test_missing_and_malformed_folders_name_what_was_expected(tmp_path, folder):
    with pytest.raises(data.DataNotFoundError, match=r"<root>/train/<class>/<image>") as err:
        data.load("imagefolder", data_dir=tmp_path, folder="imagenet")
    assert str((tmp_path / "imagenet" / "train").resolve()) in str(err.value)
    bad = tmp_path / "bad"
    (bad / "train" / "cat").mkdir(parents=True)
    with pytest.raises(data.DataError, match="has no images"):
        data.load("imagefolder", data_dir=tmp_path, folder="bad")
    write_image_folder(bad, classes=1, train_per_class=1, val_per_class=1)
    (bad / "train" / "cat").rmdir()
    for p in (bad / "val" / "class_00").iterdir():
        p.rename(bad / "val" / p.name)
    (bad / "val" / "class_00").rmdir()
    with pytest.raises(data.DataError, match="no class folders.*valprep"):
        data.load("imagefolder", data_dir=tmp_path, folder="bad")
    (bad / "val" / "dog").mkdir()
    (bad / "val" / "dog" / "x.png").write_bytes(b"not an image")
    with pytest.raises(data.DataError, match="not in train/: dog"):
        data.load("imagefolder", data_dir=tmp_path, folder="bad")
    with pytest.raises(data.DataError, match="cannot decode .*x.png"):
        decode(bad / "val" / "dog" / "x.png", 8, 8)


@pytest.mark.parametrize("options, message", [
    ({"resize_size": 8, "image_size": 12}, "resize_size"),
    ({"cache": "disk"}, "auto, memory, none"), ({"crop_scale_min": 2}, "crop_scale_min"),
    ({"workers": -1}, "workers"), ({"colour": 1}, "valid options"),
])
def test_bad_options(folder, options, message):
    with pytest.raises(ValueError, match=message):
        load(folder, **options)


def test_generated_folder_is_written_once_and_never_over_a_foreign_folder(tmp_path):
    params = dict(classes=2, train_per_class=2, val_per_class=1, size=12, fmt="png", seed=0)
    root = ensure_generated(tmp_path / "gen", params)
    stamp = (root / MARKER).stat().st_mtime_ns
    assert ensure_generated(tmp_path / "gen", params) == root \
        and (root / MARKER).stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="remove it to regenerate"):
        ensure_generated(tmp_path / "gen", {**params, "seed": 1})
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="not generated by bnlab"):
        ensure_generated(tmp_path / "mine", params)
