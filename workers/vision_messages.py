"""Images in chat messages and the processor that renders them, for vision-language policies
(used by the data loader, hybrid/multimodal.py, and by the multi-turn loop's turns with
images, workers/rollout/multi_turn_images.py):

* `load_processor`: the checkpoint's processor (AutoProcessor). Without torchvision,
  transformers cannot build the Qwen-VL processors at all (their video processor needs it,
  and the class check fails even with no video); the processor is then built from the same
  parts minus the video processor (the image processor falls back to its PIL version), and
  says so in one line.
* `process_image`: one image (PIL, a dict with bytes/image/path, a file path, or a `data:`
  URI as SkyRL's examples write them) as a PIL RGB image.
* `message_images`: OpenAI-style messages whose content is a list of parts (`{"type":
  "image", "image": ...}`, `{"type": "image_url", "image_url": {"url": ...}}`, `{"type":
  "text", "text": ...}`; SkyRL's geometry3k and VisGym prompts and observations) -> the same
  messages with each image part reduced to `{"type": "image"}` (what the Qwen-VL chat
  templates render as the image's placeholder) and the images in order. Parquet gives a
  part every key of every part (None where absent) and arrays for lists; both are read.
"""

from __future__ import annotations

import base64
import io
import os

import numpy as np

IMAGE_PART_TYPES = ("image", "image_url")


def _image_only(processor_cls):
    """`processor_cls` accepting no video processor (transformers checks every sub-processor's
    class, and the video processors' base class does not exist without torchvision)."""

    class ImageOnly(processor_cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImageOnly.__name__ = ImageOnly.__qualname__ = f"{processor_cls.__name__}ImagesOnly"
    return ImageOnly


def load_processor(path: str, trust_remote_code: bool = False):
    """The processor of the vision-language checkpoint at `path` (see the module docstring),
    with the model config kept on it (`processor.config`, as verl's hf_processor)."""
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.utils import is_torchvision_available

    from workers.vision import unsupported_vision_model

    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if is_torchvision_available():
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        processor.config = hf_config
        return processor
    model_type = hf_config.model_type
    problem = unsupported_vision_model(model_type)
    if problem:
        raise ValueError(f"{path}: {problem}")
    processor_cls = getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    template_file = os.path.join(path, "chat_template.jinja")
    template = open(template_file).read() if os.path.isfile(template_file) else tokenizer.chat_template
    print(
        f"torchvision is not installed: the {processor_cls.__name__} of {path} is built without its video "
        f"processor (images only, PIL image processing)"
    )
    processor = _image_only(processor_cls)(
        image_processor=AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code),
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=template,
    )
    processor.config = hf_config
    return processor


def vision_processor_of(model_config, hf_config):
    """The processor an engine renders a multi-turn loop's images with: the checkpoint's, for a
    vision-language policy loaded whole; None for a text policy."""
    from workers.vision import is_vision_model

    if not is_vision_model(hf_config) or getattr(model_config, "language_model_only", False):
        return None
    return load_processor(model_config.path, bool(model_config.trust_remote_code))


def _open_url(url: str, where: str):
    from PIL import Image

    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise ValueError(f"{where}an image data URI must be base64-encoded (data:image/...;base64,...)")
        return Image.open(io.BytesIO(base64.b64decode(payload)))
    if url.startswith(("http://", "https://")):
        raise ValueError(f"{where}image URL {url[:80]}: images are not downloaded; give the image inline (data: URI)")
    return Image.open(url[len("file://") :] if url.startswith("file://") else url)


def process_image(image, where: str = ""):
    """A PIL RGB image from a PIL image, a dict with bytes/image/path/url, a file path or a data URI."""
    from PIL import Image

    if isinstance(image, dict):
        if image.get("bytes") is not None:
            image = Image.open(io.BytesIO(image["bytes"]))
        elif image.get("image") is not None:
            image = image["image"]
        elif image.get("path"):
            image = Image.open(image["path"])
        elif image.get("url"):
            image = _open_url(image["url"], where)
        else:
            raise ValueError(f"{where}an image dict needs 'bytes', 'image', 'path' or 'url'; got keys {sorted(image)}")
    if isinstance(image, str):
        image = _open_url(image, where)
    if isinstance(image, dict):
        return process_image(image, where)
    if not isinstance(image, Image.Image):
        raise TypeError(f"{where}an image must be a PIL image, a dict or a file path, got {type(image).__name__}")
    return image.convert("RGB")


def _plain(value):
    """Parquet's arrays as lists, recursively (dicts kept)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def message_images(messages, where: str = "") -> tuple[list[dict], list]:
    """(messages with image parts as {"type": "image"}, their PIL images in order); see the module doc."""
    out, images = [], []
    for message in _plain(messages):
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    parts.append({"type": "text", "text": part.get("text") or ""})
                elif kind in IMAGE_PART_TYPES:
                    payload = part.get("image") if kind == "image" else part.get("image_url")
                    if payload is None:
                        raise ValueError(f"{where}a content part of type {kind!r} without its {kind!r} field")
                    images.append(process_image(payload, where))
                    parts.append({"type": "image"})
                else:
                    raise ValueError(f"{where}a message content part of type {kind!r} (text, image or image_url)")
            message = {**message, "content": parts}
        out.append(message)
    return out, images


def _is_image_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES


def has_image_parts(messages) -> bool:
    """Whether any message's content has an image part."""
    for message in _plain(messages) if messages is not None else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(_is_image_part(p) for p in content):
            return True
    return False


__all__ = [
    "IMAGE_PART_TYPES",
    "has_image_parts",
    "load_processor",
    "message_images",
    "process_image",
    "vision_processor_of",
]
