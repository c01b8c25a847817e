"""The targets a conversion carries beside its images: annotations read (COCO, YOLO, Pascal VOC),
boxes and COCO masks (``detection``), class-index masks (``segmentation``), and the choice of one
per run (``attached``: none, boxes, masks)."""
