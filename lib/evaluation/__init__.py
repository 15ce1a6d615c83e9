"""Detection metrics, below the datasets that score with them and the stages that report them: COCO AP
(boxes, masks) through pycocotools with its summary and size bands (``coco_summary``), Pascal VOC AP and
proposal recall (``metrics``)."""
