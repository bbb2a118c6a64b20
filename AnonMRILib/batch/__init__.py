"""Many scans: BIDS dataset walking, one task per scan with resume and per-scan records, Dask scale-out.

    layout = find_scans(bids_dir, participants=["01"])            # AnonMRILib.batch.bids_layout
    records = run_scans(layout, out_dir, ScanSettings(method="remodel"), workers=4)   # .runner
"""
